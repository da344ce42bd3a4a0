"""Crash-safe checkpoints: Orbax, with a SHA-256 sum per file.

Orbax writes each checkpoint into a temporary folder and renames it when
complete, so a `kill -9` mid-save leaves the previous checkpoint intact; the
JSON metadata (step, best BLEU, ...) is saved inside the same checkpoint so
arrays and bookkeeping can never disagree.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
import warnings
from typing import Any, Callable, Iterator

import jax
import orbax.checkpoint as ocp

from attention_jax import files
from attention_jax.training import multihost


class Checkpointer:
  """Keeps the latest two checkpoints of a pytree of arrays plus JSON metadata.

  Orbax has no integrity check of its own on restore, so every saved step
  gets a SHA-256 of each of its files in `<directory>_sha256/<step>.json`,
  written after Orbax has committed the step. `restore_latest` verifies the
  newest step against it (and that Orbax can read it); a damaged step is
  moved to `<directory>_damaged/`, named in one log line, and the previous
  step is tried. A step without a checksum file (killed between its commit
  and its checksum file) cannot be verified, and damage in it would be
  trained on and later recorded as a divergence: it is never preferred over
  a verified step (`restore_latest`).
  """

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self.sums_dir = self.directory + "_sha256"
    self.damaged_dir = self.directory + "_damaged"
    for folder in (self.directory, self.sums_dir, self.damaged_dir):
      check_folder(folder)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False,
            cleanup_tmp_directories=True))

  def save(self, step: int, arrays: Any, meta: dict) -> None:
    """Saves `step`. A write the system refuses (a full disk, a file size
    limit) raises an OSError naming the step's folder, with Orbax's own
    error records (a traceback per thread, ~115 lines) kept off the terminal."""
    try:
      with orbax_records_dropped():
        self.manager.save(step, args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  # re-raised unless an OS error
      error = os_error(e, self._step_dir(step))
      if error is None:
        raise
      quiet_after_failed_save()
      raise error from None
    if not multihost.is_primary():
      return
    files.atomic_write(self._sums_path(step),
                       files.to_json(_digests(self._step_dir(step)), indent=0))
    kept = {str(s) for s in self.manager.all_steps()}
    for name in os.listdir(self.sums_dir):
      if name.endswith(".json") and name[:-5] not in kept:  # Orbax removed that step
        os.remove(os.path.join(self.sums_dir, name))

  def restore_latest(self, like: Any, log: Callable[[str], None] = print):
    """`(arrays, meta)` of the newest intact checkpoint, or None.

    `like` is a pytree with the target structure, shapes, dtypes and shardings.
    Verified steps (with a checksum file) are tried first, newest first; once
    one is read, every newer step without a checksum file is set aside, named
    in one line (the run goes on from the verified step and will save those
    steps again). A step without a checksum file is used only where no
    verified step is intact, with a warning line.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    steps = sorted(self.manager.all_steps(), reverse=True)
    verified = [s for s in steps if os.path.exists(self._sums_path(s))]
    set_aside = False
    for step in verified + [s for s in steps if s not in verified]:
      problem = self._verify(step) if step in verified else None
      if problem is None:
        try:
          with orbax_records_dropped():  # the one line below says what went wrong
            out = self.manager.restore(step, args=ocp.args.Composite(
                arrays=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except Exception as e:  # pylint: disable=broad-except  # any unreadable step
          problem = f"Orbax cannot read it: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
      if problem is None and step in verified:
        for newer in [s for s in steps if s > step and s not in verified]:
          dest = self._move_aside(newer)
          log(f"checkpoint step {newer} in {self.directory} has no checksum file, so it "
              f"cannot be verified; moved to {dest}; using verified step {step}")
        return out["arrays"], out["meta"]
      if problem is None:
        log(f"warning: checkpoint step {step} in {self.directory} has no checksum file "
            "and no verified step is intact; using it unverified")
        return out["arrays"], out["meta"]
      dest = self._move_aside(step)
      log(f"checkpoint step {step} in {self.directory} is damaged ({problem}); "
          f"moved to {dest}; trying the previous one")
      set_aside = True
    if set_aside:
      log(f"no intact checkpoint left in {self.directory}; training starts from step 0")
    return None

  def _move_aside(self, step: int) -> str:
    """Moves `step` to the damaged folder once every process has read the
    checkpoint folder; returns where it went."""
    multihost.sync(f"verified {self.directory} {step}")  # everyone read it
    dest = self._set_aside(step) if multihost.is_primary() else "the damaged folder"
    multihost.sync(f"set aside {self.directory} {step}")
    self.manager.reload()
    return dest

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _sums_path(self, step: int) -> str:
    return os.path.join(self.sums_dir, f"{step}.json")

  def _verify(self, step: int) -> str | None:
    """None if the step matches its checksums, else what differs."""
    try:
      expected = files.read_json(self._sums_path(step), dict)
    except FileNotFoundError:
      return f"its checksum file {self._sums_path(step)} is gone"
    except ValueError:
      return f"its checksum file {self._sums_path(step)} is unreadable"
    found = _digests(self._step_dir(step))
    for rel, digest in sorted(expected.items()):
      if rel not in found:
        return f"{rel} is missing"
      if found[rel] != digest:
        return f"{rel} does not match its SHA-256"
    return None

  def _set_aside(self, step: int) -> str:
    os.makedirs(self.damaged_dir, exist_ok=True)
    dest = os.path.join(self.damaged_dir, str(step))
    n = 1
    while os.path.exists(dest):
      dest = os.path.join(self.damaged_dir, f"{step}.{n}")
      n += 1
    os.replace(self._step_dir(step), dest)
    if os.path.exists(self._sums_path(step)):
      os.replace(self._sums_path(step), os.path.join(dest, "sha256.json"))
    return dest


def check_folder(path: str) -> None:
  """A ValueError of one line naming `path` if something other than a
  folder is there. Orbax, given a file, reports it from a worker thread as
  a ~40-line traceback and the save fails only after the first steps were
  trained; checked here, the run is refused before it starts."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{path} is a file where the checkpoints' folder belongs; move it "
                     "away (or delete it) and re-run.")


_ORBAX_DIR = os.path.dirname(os.path.abspath(ocp.__file__))


class _DropOrbax(logging.Filter):
  """Drops the records logged from Orbax's own files."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not os.path.abspath(record.pathname).startswith(_ORBAX_DIR)


class _DropStrayWrites(logging.Filter):
  """Drops asyncio's report of a refused write's task that nobody awaited."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not ("never retrieved" in text and "os_error_code" in text)


class _DropClosedLoopCallbacks:
  """A `sys.unraisablehook` that drops the RuntimeError of a callback into an
  event loop already closed, and passes anything else to `hook`."""

  def __init__(self, hook):
    self.hook = hook

  def __call__(self, unraisable) -> None:
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
      self.hook(unraisable)


_DROP_ORBAX, _DROP_STRAY_WRITES = _DropOrbax(), _DropStrayWrites()
_quiet_after_failure = {"on": False}


@contextlib.contextmanager
def orbax_records_dropped() -> Iterator[None]:
  """Keeps what a failed Orbax save or restore prints off the terminal; the
  error it raises is what the caller reports, in one line.

  Inside, what Orbax logs is dropped (through absl's logger, from its worker
  threads too: a traceback per thread at ERROR, ~115 lines for one refused
  write). A refused write also leaves the save's other writes to end in
  TensorStore's threads, each calling back into Orbax's event loop once it
  is closed (an unraisable RuntimeError, printed as a traceback) and leaving
  an asyncio task whose error nobody retrieved (logged when it is
  collected): from 20 to 900 more lines, measured, some after the save has
  raised, and their coroutines are collected unawaited (a RuntimeWarning).
  Those three kinds are dropped from the first save on, for good (they are
  never anything else), and Orbax's records too once a save has failed
  (`quiet_after_failed_save`). Other libraries' records pass.
  """
  logging.getLogger("asyncio").addFilter(_DROP_STRAY_WRITES)  # once: a set of filters
  if not isinstance(sys.unraisablehook, _DropClosedLoopCallbacks):
    sys.unraisablehook = _DropClosedLoopCallbacks(sys.unraisablehook)
    # The stray writes' coroutines, collected unawaited.
    warnings.filterwarnings("ignore", message="coroutine 'async_serialize_from_host",
                            category=RuntimeWarning)
  logger = logging.getLogger("absl")
  added = _DROP_ORBAX not in logger.filters
  logger.addFilter(_DROP_ORBAX)
  try:
    yield
  finally:
    if added and not _quiet_after_failure["on"]:
      logger.removeFilter(_DROP_ORBAX)


def quiet_after_failed_save() -> None:
  """Drops Orbax's records for the rest of the process: after a failed
  save its threads may still log their errors (`orbax_records_dropped`)."""
  _quiet_after_failure["on"] = True
  logging.getLogger("absl").addFilter(_DROP_ORBAX)


def os_error(error: BaseException, path: str) -> OSError | None:
  """`error` as an OSError naming `path`, if it is a refused write: Orbax
  passes TensorStore's as a ValueError whose text ends in
  "[os_error_code='28']" (ENOSPC; 27, EFBIG, past a file size limit). None
  for any other error."""
  if isinstance(error, OSError):
    return OSError(error.errno, error.strerror, error.filename or path)
  match = re.search(r"os_error_code='?(\d+)", str(error))
  if match is None:
    return None
  code = int(match.group(1))
  return OSError(code, os.strerror(code), path)


def _digests(folder: str) -> dict[str, str]:
  """SHA-256 of every file under `folder`, keyed by relative path."""
  out = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      h = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          h.update(block)
      out[os.path.relpath(path, folder)] = h.hexdigest()
  return out
