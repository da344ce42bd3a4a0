"""`benchmark.jsonl`: rows appended as they are measured, never rewritten.

Each row is one JSON line, written, flushed and fsynced before the next
measurement starts, and stamped with the machine and the `run` it belongs to,
so a killed or crashed run loses nothing measured, before or by it. Read
back (`read_rows`), a line cut by a kill is skipped and a row of the wrong
shape is named.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Iterator

from attention_jax.measure import provenance
from experiments.kernels import report

MACHINE_FIELDS = ("platform", "device_kind", "cpu", "cpu_cores")
_SHOWN = ("mode", "dtype", "batch", "heads", "seq_len", "head_dim", "causal", "model")


# The fields the report reads, by kind (`row_problem`); a number may be null
# (a case skipped or refused has no time).
_TEXT = ("suite", "impl", "status")
_OPTIONAL_TEXT = ("mode", "dtype", "model", "size", "reason", "run", "library_implementation")
_NUMBERS = ("time_median_s", "time_iqr_s", "time_min_s", "time_max_s", "tflops", "pct_peak",
            "temp_bytes", "other_load_cores", "loadavg_1m", "tokens_per_s", "params", "batch",
            "heads", "seq_len", "head_dim", "attention_dim", "seeds", "cpu_cores")


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def row_problem(row) -> str | None:
  """What in `row` (a parsed line of benchmark.jsonl) the report could not
  read, in a few words; None if nothing. Such a row crashed the report
  (a time of "abc" reached the formatting of numbers) naming no file."""
  if not isinstance(row, dict):
    return f"a JSON {type(row).__name__}, not an object"
  for key in _TEXT:
    if not isinstance(row.get(key), str):
      return f"`{key}` is {row.get(key)!r}, not a string"
  for key in _OPTIONAL_TEXT:
    if row.get(key) is not None and not isinstance(row[key], str):
      return f"`{key}` is {row[key]!r}, not a string"
  for key in _NUMBERS:
    if row.get(key) is not None and not _is_number(row[key]):
      return f"`{key}` is {row[key]!r}, not a number"
  if row.get("causal") is not None and not isinstance(row["causal"], bool):
    return f"`causal` is {row['causal']!r}, not true or false"
  return None


def read_rows(path: str) -> list[dict[str, Any]]:
  """The complete rows of a benchmark.jsonl (none if it does not exist).

  A line that is not JSON is one cut by a kill or a full disk, and is
  skipped (its case is measured again). A line that is JSON but not a row
  the report can read (`row_problem`) is a ValueError of one line naming the
  file and the line, before anything is measured or written.
  """
  if not os.path.exists(path):
    return []
  rows = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for number, line in enumerate(f, 1):
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      problem = row_problem(row)
      if problem is not None:
        raise ValueError(f"{path} line {number} is damaged ({problem}); delete that line "
                         "and re-run the same command to measure its case again.")
      rows.append(row)
  return rows


def end_last_line(path: str) -> None:
  """Ends a row cut by a kill or a full disk with a newline, so that the rows
  appended next start on their own line (readers skip the cut one)."""
  with open(path, "ab+") as f:
    if f.seek(0, os.SEEK_END) and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
      f.write(b"\n")


def describe(row: dict[str, Any]) -> str:
  """The progress line printed for a row."""
  shown = row.get("time_median_s")
  return (f"[{row['suite']}] {row['impl']:>22} "
          + " ".join(f"{k}={row[k]}" for k in _SHOWN if k in row)
          + f"  {row['status']}" + (f"  {report.fmt_time(shown)}" if shown else "")
          + (f"  ({row['reason'][:120]})" if row.get("reason") and row["status"] != "ok" else ""))


@contextlib.contextmanager
def appending(path: str, machine: dict[str, Any],
              run_id: str) -> Iterator[Callable[[dict], dict]]:
  """Yields `write(row) -> stamped row`: appends the row to `path` (durably) and
  prints its progress line."""
  end_last_line(path)
  with open(path, "a", encoding="utf-8") as f:

    def write(row: dict) -> dict:
      row = {**row, **{k: machine[k] for k in MACHINE_FIELDS},
             # Other processes' load shows here (this process adds up to its
             # own thread count while it measures).
             "loadavg_1m": os.getloadavg()[0], "run": run_id,
             provenance.KEY: provenance.fields()}
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())
      print(describe(row), flush=True)
      return row

    yield write
