"""scripts/eta_table.py: the ETA table of a time-stamped sweep log."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("eta_table", ROOT / "scripts" / "eta_table.py")
eta_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eta_table)

LOG = """\
100.0 [a d=8] step 20/40 loss 1.0 1.0 | 10 target tok/s | ETA not yet timed, sweep not yet timed | 04:00 UTC
110.0 [a d=8] step 40/40 loss 1.0 1.0 | 10 target tok/s | ETA 8 s, sweep 1.0 min | 04:00 UTC
120.0 [a d=8] test BLEU 1.0 2.0 (5 s)
130.0 [b d=8] step 40/40 loss 1.0 1.0 | 10 target tok/s | ETA 30 s, sweep 40 s | 04:01 UTC
150.0 [b d=8] test BLEU 1.0 2.0 (5 s)
170.0 wrote table.md in <workdir>
"""


def test_durations_read_as_the_progress_line_writes_them():
  assert [eta_table.seconds(t) for t in ("9 s", "1.5 min", "2.0 h", "not yet timed", None)] == [
      9.0, 90.0, 7200.0, None, None]


def test_each_timed_line_against_the_time_its_run_and_the_sweep_had_left():
  rows = eta_table.rows(LOG.splitlines())
  assert [(r[0], r[4], r[5], r[6], r[8], r[9]) for r in rows] == [
      ("a d=8", "8 s", "10.0 s", "0.80", "60 s", "1.00"),
      ("b d=8", "30 s", "20.0 s", "1.50", "40 s", "1.00")]
  assert [eta_table.within(r[6]) for r in rows] == [True, False]
