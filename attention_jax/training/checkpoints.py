"""Crash-safe persistence: Orbax checkpoints and atomic file writes.

Orbax writes each checkpoint into a temporary folder and renames it when
complete, so a `kill -9` mid-save leaves the previous checkpoint intact; the
JSON metadata (step, best BLEU, ...) is saved inside the same checkpoint so
arrays and bookkeeping can never disagree.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import jax
import orbax.checkpoint as ocp


def atomic_write(path: str, text: str) -> None:
  """Replaces `path` with `text` so that readers see the old or the new file, never half."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-" + os.path.basename(path))
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


class Checkpointer:
  """Keeps the latest two checkpoints of a pytree of arrays plus JSON metadata."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False,
            cleanup_tmp_directories=True))

  def save(self, step: int, arrays: Any, meta: dict) -> None:
    self.manager.save(step, args=ocp.args.Composite(
        arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)), force=True)
    self.manager.wait_until_finished()

  def restore_latest(self, like: Any):
    """`(arrays, meta)` of the newest complete checkpoint, or None.

    `like` is a pytree with the target structure, shapes, dtypes and shardings.
    """
    step = self.manager.latest_step()
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    out = self.manager.restore(step, args=ocp.args.Composite(
        arrays=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return out["arrays"], out["meta"]
