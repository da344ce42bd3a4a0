"""The per-run metrics log: `metrics.jsonl`, one JSON object per line.

Each row has a `step` and a `seed`, and the values of one periodic action
(training loss and softmax diagnostics, or validation BLEU and perplexity);
a resumed run trims the rows past its checkpoint, so the log always matches
the checkpoint training goes on from.
"""

from __future__ import annotations

import errno
import json
import math
import os
from typing import TYPE_CHECKING, Callable

from attention_jax.training import files

if TYPE_CHECKING:
  from attention_jax.training import board as board_lib


def rounded(x) -> float | None:
  """`x` to 6 significant digits, as every logged number; None if not finite."""
  x = float(x)
  return float(f"{x:.6g}") if math.isfinite(x) else None


class MetricsLog:
  """Append-only JSON-lines log that a resumed run trims back to its checkpoint.

  The writer keeps every line it has read or written since `truncate_after`
  and checks before each append that the file still holds them (by size): a
  file deleted or cut while the run goes on is rewritten in full, with one
  warning line, instead of silently restarting from the next line.
  """

  def __init__(self, path: str, log: Callable[[str], None] = print, write: bool = True,
               board: "board_lib.Board | None" = None):
    self.path = path
    self.log = log
    self.write = write  # False: every call but `read` does nothing (not the primary process)
    self.board = board  # also sends every appended row to TensorBoard
    self._lines: list[str] | None = None  # None: a read-only view
    self._size = 0

  def read(self) -> list[dict]:
    if not os.path.exists(self.path):
      return []
    rows = []
    with open(self.path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill: dropped
          continue
        if isinstance(row, dict) and "step" in row:  # what else parses is no row of ours
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
