"""`benchmark.jsonl`: rows appended as they are measured, never rewritten.

Each row is one JSON line, written, flushed and fsynced before the next
measurement starts, and stamped with the machine and the `run` it belongs to,
so a killed or crashed run loses nothing measured, before or by it.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Iterator

from attention_jax.training import provenance
from experiments.benchmarks import report

MACHINE_FIELDS = ("platform", "device_kind", "cpu", "cpu_cores")
_SHOWN = ("mode", "dtype", "batch", "heads", "seq_len", "head_dim", "causal", "model")


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
