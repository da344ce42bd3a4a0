"""The per-run metrics log: `metrics.jsonl`, one JSON object per line, and
its TensorBoard view.

Each row has a `step` and a `seed`, and the values of one periodic action
(training loss and softmax diagnostics, or validation BLEU and perplexity);
a resumed run trims the rows past its checkpoint, so the log always matches
the checkpoint training goes on from.

`Board`: TensorBoard event files beside each run's `metrics.jsonl`.

Written with tensorboardX, which needs no TensorFlow. One TensorBoard run per
seed, `<run_dir>/tensorboard/seed_<n>/` (per member in a run with member
values, `<run_dir>/tensorboard/learning_rate=0.001/seed_<n>/`), so
`tensorboard --logdir WORKDIR` shows every arm, dimension, grid point and
seed of a sweep side by side.
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

import errno
import json
import math
import os
import time
from typing import Callable, Iterable, Mapping, Sequence

from attention_jax import files


def rounded(x) -> float | None:
  """`x` to 6 significant digits, as every logged number; None if not finite."""
  x = float(x)
  return float(f"{x:.6g}") if math.isfinite(x) else None


# What a damaged line of a log asks of its reader.
REMEDY = "correct or delete that line"
# Keys whose values are perplexities: exp of a mean cross-entropy, at least
# 1 (the threshold report takes their log; 0 or less was a math error).
PERPLEXITIES = ("val_ppl",)


def _not_finite(constant: str) -> None:
  """A bare NaN, Infinity or -Infinity in a line: read as null (`MetricsLog.read`)."""
  del constant


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _value_problem(key: str, value) -> str | None:
  """What makes `value` (of `key`; an object's keys as `key.inner`) no
  logged value: every value is a number or null (not finite), or an object
  of such; a perplexity is at least 1."""
  if isinstance(value, dict):
    return next(filter(None, (_value_problem(f"{key}.{k}", v) for k, v in value.items())),
                None)
  if value is None:
    return None
  if not _is_number(value):
    return f"`{key}` is {value!r}, not a number"
  if key in PERPLEXITIES and value < 1:
    return f"`{key}` is {value!r}, not a perplexity (at least 1)"
  return None


def row_problem(row: dict) -> str | None:
  """What makes a metrics-log row (a JSON object with a `step`, non-finite
  numbers already null) unreadable, in a few words; None if nothing: its
  `step` and `seed` integers, every other value a number or null
  (`_value_problem`). A string or 0 where a perplexity goes was a traceback
  (or a message naming no file) in the reader that took its log."""
  for key in ("step", "seed"):
    if key in row and (not isinstance(row[key], int) or isinstance(row[key], bool)):
      return f"`{key}` is {row[key]!r}, not an integer"
  return next(filter(None, (_value_problem(k, v) for k, v in row.items()
                            if k not in ("step", "seed"))), None)


class MetricsLog:
  """Append-only JSON-lines log that a resumed run trims back to its checkpoint.

  The writer keeps every line it has read or written since `truncate_after`
  and checks before each append that the file still holds them (by size): a
  file deleted or cut while the run goes on is rewritten in full, with one
  warning line, instead of silently restarting from the next line.
  """

  def __init__(self, path: str, log: Callable[[str], None] = print, write: bool = True,
               board: Board | None = None):
    self.path = path
    self.log = log
    self.write = write  # False: every call but `read` does nothing (not the primary process)
    self.board = board  # also sends every appended row to TensorBoard
    self._lines: list[str] | None = None  # None: a read-only view
    self._size = 0

  def read(self) -> list[dict]:
    """The log's rows: its JSON objects with a `step` (what else parses is
    no row of ours). A bare NaN or Infinity, which a writer before strict
    JSON put where a value was not finite, reads as the null written there
    now (`rounded`): to every reader a value that is not a number (a null
    validation perplexity: the member diverged). The last line without its
    newline is a write cut by a kill, dropped; any other line that is not
    JSON, or a row with a value of another kind (`row_problem`), is a
    ValueError of one line naming the file and the line."""
    if not os.path.exists(self.path):
      return []
    with open(self.path, "rb") as f:
      lines = f.read().split(b"\n")
    rows = []
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line.decode("utf-8"), parse_constant=_not_finite)
      except ValueError as e:  # JSONDecodeError, or bytes that are not text
        if number == len(lines):  # the last line, without its newline: cut by a kill
          continue
        why = e.msg if isinstance(e, json.JSONDecodeError) else "not text"
        raise ValueError(f"{self.path} line {number} is damaged (not JSON: {why}); "
                         f"{REMEDY}.") from None
      if not isinstance(row, dict) or "step" not in row:
        continue
      row = files.finite(row)  # 1e999 parses as inf
      problem = row_problem(row)
      if problem is not None:
        raise ValueError(f"{self.path} line {number} is damaged ({problem}); {REMEDY}.")
      rows.append(row)
    return rows

  def truncate_after(self, step: int) -> None:
    if not self.write:
      return
    self._lines = [files.to_json(r) + "\n" for r in self.read() if r["step"] <= step]
    self._rewrite()

  def _rewrite(self) -> None:
    text = "".join(self._lines)
    files.atomic_write(self.path, text)
    self._size = len(text.encode())

  def append(self, row: dict) -> None:
    if not self.write:
      return
    if self.board is not None:
      self.board.row(row)
    line = files.to_json(row) + "\n"
    if self._lines is None:  # not opened for writing by truncate_after
      with open(self.path, "a") as f:
        f.write(line)
      return
    self._lines.append(line)
    try:
      intact = os.path.isfile(self.path) and os.path.getsize(self.path) == self._size
    except FileNotFoundError:
      intact = False
    if not intact:
      if os.path.lexists(self.path) and not os.path.isfile(self.path):
        raise IsADirectoryError(errno.EISDIR, "not a file any more: something put a folder "
                                "or another kind of file in its place during the run",
                                self.path)
      self._rewrite()  # the warning only once it is true
      self.log(f"warning: {self.path} was deleted or changed by something else during "
               f"the run; rewrote its {len(self._lines)} lines from memory")
      return
    with open(self.path, "a") as f:
      f.write(line)
    self._size += len(line.encode())


# metrics.jsonl keys with a name of their own; every other key is an
# attention diagnostic.
TAGS = {"loss": "train/loss", "val_bleu": "validation/bleu",
        "val_ppl": "validation/perplexity", "test_bleu": "test/bleu",
        "learning_rate": "train/learning_rate",
        "tokens_per_second": "train/target_tokens_per_second"}
FOLDER = "tensorboard"


def tag(key: str) -> str:
  return TAGS.get(key, f"attention/{key}")


def _folder(member: Mapping) -> str:
  """A member's TensorBoard folder: `seed_0`, or its values first
  (`learning_rate=0.001/seed_0`)."""
  values = [f"{k}={v!r}" for k, v in member.items() if k != "seed"]
  return os.path.join(*values, f"seed_{int(member['seed'])}")


def _add(writer, step: int, values: Mapping) -> None:
  for key, value in values.items():
    if isinstance(value, (int, float)):
      writer.add_scalar(tag(key), value, step)


class Board:
  """Scalar writers of one run, one per member; does nothing when `enabled`
  is False (processes other than the primary) or tensorboardX is missing (one
  warning line through `log`).

  A member is named as its rows name it (`members`: `{"seed": 0}`, or with
  its member values `{"seed": 0, "learning_rate": 0.001}`); default: one per
  seed of `seeds`.
  """

  def __init__(self, run_dir: str, seeds: Iterable[int], *,
               members: Sequence[Mapping] | None = None, start_step: int = 0,
               enabled: bool = True, log: Callable[[str], None] = print):
    self.writers = {}
    members = ([{"seed": int(s)} for s in seeds] if members is None
               else [dict(m) for m in members])
    self.keys = tuple(members[0]) if members else ("seed",)  # what names a member in a row
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
    for member in members:
      self.writers[self._key(member)] = SummaryWriter(
          os.path.join(run_dir, FOLDER, _folder(member)), purge_step=purge,
          flush_secs=30, filename_suffix=suffix)

  def _key(self, row: Mapping) -> tuple:
    return tuple(row.get(k) for k in self.keys)

  def row(self, row: dict) -> None:
    """A `metrics.jsonl` row (`step`, the member's `seed` and values, and
    scalars; None is skipped)."""
    self.scalars(row, row.get("step"),
                 {k: v for k, v in row.items() if k != "step" and k not in self.keys})

  def scalars(self, member: Mapping, step: int, values: Mapping) -> None:
    """`values` of the member named by `member` (as a row names it) at `step`."""
    writer = self.writers.get(self._key(member))
    if writer is not None:
      _add(writer, step, values)

  def every_seed(self, step: int, values: dict) -> None:
    """Scalars shared by all members (throughput)."""
    for writer in self.writers.values():
      _add(writer, step, values)

  def flush(self) -> None:
    for writer in self.writers.values():
      writer.flush()

  def close(self) -> None:
    for writer in self.writers.values():
      writer.close()
    self.writers = {}
