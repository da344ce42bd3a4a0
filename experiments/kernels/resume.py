"""A benchmark that resumes: cases already in `benchmark.jsonl` are not measured again.

A measurement is named by its `row_key`: the suite, the implementation, the
shape and dtype fields of its case, and the device it ran on. A suite asks
`Progress.pending(case_fields, impls)` before it measures a case and gets the
implementations still missing there; with none it skips the case. So a run
killed after some cases (a device command has 10 minutes) is continued by the
same command, with no row measured twice, and `max_minutes` stops a run
cleanly between two cases (`OutOfTime`), the rows so far on disk.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

# The fields that name one measurement; a field a suite's rows lack is None.
KEY_FIELDS = ("suite", "impl", "mode", "dtype", "batch", "heads", "seq_len", "head_dim",
              "causal", "library_implementation", "attention_dim", "model", "size",
              "platform", "device_kind")


class OutOfTime(Exception):
  """`max_minutes` passed: the run stops before its next case."""


def row_key(row: dict[str, Any]) -> tuple:
  """The measurement a row (or a case's fields with `impl` and the machine) names."""
  return tuple(row.get(field) for field in KEY_FIELDS)


class Progress:
  """What is measured already, what this run asked for, and its deadline.

  Args:
    rows: the rows already in benchmark.jsonl.
    machine: this machine's `platform` and `device_kind` (a row of another
      device never counts as done).
    max_minutes: stop before a case that starts later than this (None: never).
    report_only: answer every case as done (rewrites the report from the
      rows on disk without measuring).
    clock: seconds, monotonic (tests pass their own).
  """

  def __init__(self, rows: Iterable[dict], machine: dict[str, Any], *,
               max_minutes: float | None = None, report_only: bool = False,
               clock: Callable[[], float] = time.monotonic):
    if max_minutes is not None and not max_minutes > 0:
      raise ValueError(f"`--max_minutes` must be > 0, got {max_minutes}.")
    self.machine = {k: machine.get(k) for k in ("platform", "device_kind")}
    self.done: dict[tuple, dict] = {}  # key -> the latest row measuring it
    for row in rows:
      if row.get("status") is not None:
        self.done[row_key(row)] = row
    self.asked: dict[tuple, None] = {}  # keys this run asked for, in order
    self.skipped_cases = 0
    self.report_only = report_only
    self._clock = clock
    self._deadline = None if max_minutes is None else clock() + 60.0 * max_minutes

  def key(self, case_fields: dict[str, Any], impl: str) -> tuple:
    return row_key({**case_fields, "impl": impl, **self.machine})

  def pending(self, case_fields: dict[str, Any], impls: Iterable[str]) -> list[str]:
    """The implementations of `impls` not yet measured at this case.

    Raises `OutOfTime` when some are missing and `max_minutes` has passed.
    """
    impls = list(impls)
    keys = [self.key(case_fields, impl) for impl in impls]
    self.asked.update(dict.fromkeys(keys))
    missing = [impl for impl, k in zip(impls, keys) if k not in self.done]
    if self.report_only or not missing:
      self.skipped_cases += 1
      return []
    if self._deadline is not None and self._clock() > self._deadline:
      raise OutOfTime()
    return missing

  def has(self, row: dict[str, Any]) -> bool:
    """Whether what `row` measures is on disk already."""
    return row_key(row) in self.done

  def add(self, row: dict[str, Any]) -> None:
    """Counts `row` (as written, with the machine's fields) as done."""
    self.done[row_key(row)] = row

  def rows_asked(self) -> list[dict[str, Any]]:
    """The latest row of every measurement this run asked for, old or new."""
    return [self.done[k] for k in self.asked if k in self.done]

  def missing_count(self) -> int:
    """Measurements asked for and still missing."""
    return sum(1 for k in self.asked if k not in self.done)
