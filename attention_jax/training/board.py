"""TensorBoard event files beside each run's `metrics.jsonl`.

Written with tensorboardX, which needs no TensorFlow. One TensorBoard run per
seed, `<run_dir>/tensorboard/seed_<n>/`, so `tensorboard --logdir WORKDIR`
shows every arm, dimension, grid point and seed of a sweep side by side.
`metrics.jsonl` stays the source of the tables and plots; the event files
are a view of the same numbers:

  train/loss, train/learning_rate, train/target_tokens_per_second
  validation/bleu, validation/perplexity, test/bleu
  attention/<diagnostic>   logit_std, entropy, saturated, max_logit, grad_norm
                           (and the Transformer's per-layer max_logit_*)

The trainer flushes the writers before every checkpoint, so what a killed
process logged up to its last checkpoint is on disk; the resumed run opens
its writers with `purge_step = s + 1` (s the checkpoint's step), and
TensorBoard drops what the killed process wrote after s, as `metrics.jsonl`
is cut back to it.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

# metrics.jsonl keys with a name of their own; every other key is an
# attention diagnostic.
TAGS = {"loss": "train/loss", "val_bleu": "validation/bleu",
        "val_ppl": "validation/perplexity", "test_bleu": "test/bleu",
        "learning_rate": "train/learning_rate",
        "tokens_per_second": "train/target_tokens_per_second"}
FOLDER = "tensorboard"


def tag(key: str) -> str:
  return TAGS.get(key, f"attention/{key}")


class Board:
  """Scalar writers of one run, one per seed; does nothing when `enabled` is
  False (processes other than the primary) or tensorboardX is missing (one
  warning line through `log`)."""

  def __init__(self, run_dir: str, seeds: Iterable[int], *, start_step: int = 0,
               enabled: bool = True, log: Callable[[str], None] = print):
    self.writers = {}
    if not enabled:
      return
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    except ImportError:
      log("warning: tensorboardX is not installed, so no TensorBoard event files are "
          "written (metrics.jsonl has every number); pip install tensorboardX")
      return
    purge = start_step + 1 if start_step > 0 else None
    # tensorboardX names a file by the second it was opened; a run resumed in
    # the same second would overwrite the first file. The suffix keeps every
    # file, in the order TensorBoard reads them (by name).
    suffix = f".{time.time_ns()}.{os.getpid()}"
    for seed in seeds:
      self.writers[int(seed)] = SummaryWriter(
          os.path.join(run_dir, FOLDER, f"seed_{int(seed)}"), purge_step=purge,
          flush_secs=30, filename_suffix=suffix)

  def row(self, row: dict) -> None:
    """A `metrics.jsonl` row (`step`, `seed` and scalars; None is skipped)."""
    writer = self.writers.get(row.get("seed"))
    if writer is None:
      return
    for key, value in row.items():
      if key not in ("step", "seed") and isinstance(value, (int, float)):
        writer.add_scalar(tag(key), value, row["step"])

  def every_seed(self, step: int, values: dict) -> None:
    """Scalars shared by all seeds (learning rate, throughput)."""
    for seed in self.writers:
      self.row({"step": step, "seed": seed, **values})

  def flush(self) -> None:
    for writer in self.writers.values():
      writer.flush()

  def close(self) -> None:
    for writer in self.writers.values():
      writer.close()
    self.writers = {}
