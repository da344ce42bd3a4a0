"""The benchmark resumes: a killed or stopped run is continued by the same
command, with no measurement twice and none missing (experiments/kernels/resume.py)."""

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.kernels import jsonl
from experiments.kernels import kernels
from experiments.kernels import resume
from experiments.kernels import settings as settings_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MACHINE = {"platform": "cpu", "device_kind": "cpu"}
# 4 kernel cases (T = 8, 16, 24, 32) x 2 implementations.
ARGS = ["--preset=tiny", "--suite=kernels", "--impls=scaled_dot,naive", "--seq_lens=8,16,24,32",
        "--head_dims=8", "--heads=1", "--batch=1", "--causal=false", "--dtypes=float32",
        "--modes=fwd", "--repeats=3", "--warmup=0"]


def _case(t, **kw):
  return {"suite": "kernels", "mode": "fwd", "dtype": "float32", "batch": 1, "heads": 1,
          "seq_len": t, "head_dim": 8, "causal": False, "library_implementation": "auto", **kw}


def test_pending_names_only_what_this_device_has_not_measured():
  rows = [{**_case(16), "impl": "naive", "status": "ok", **MACHINE},
          {**_case(16), "impl": "scaled_dot", "status": "ok", "platform": "gpu",
           "device_kind": "H100"}]  # another device's row does not count here
  progress = resume.Progress(rows, MACHINE)
  assert progress.pending(_case(16), ["scaled_dot", "naive"]) == ["scaled_dot"]
  assert progress.pending(_case(32), ["scaled_dot", "naive"]) == ["scaled_dot", "naive"]
  progress.add({**_case(16), "impl": "scaled_dot", "status": "ok", **MACHINE})
  assert progress.pending(_case(16), ["scaled_dot", "naive"]) == []
  assert progress.skipped_cases == 1 and progress.missing_count() == 2
  assert [r["impl"] for r in progress.rows_asked()] == ["scaled_dot", "naive"]


def test_max_minutes_stops_between_cases_and_only_when_work_is_left():
  now = [0.0]
  progress = resume.Progress([{**_case(8), "impl": "naive", "status": "ok", **MACHINE}],
                             MACHINE, max_minutes=1.0, clock=lambda: now[0])
  assert progress.pending(_case(16), ["naive"]) == ["naive"]
  now[0] = 61.0
  assert progress.pending(_case(8), ["naive"]) == []  # done already: no time needed
  with pytest.raises(resume.OutOfTime):
    progress.pending(_case(24), ["naive"])
  with pytest.raises(ValueError, match="--max_minutes"):
    resume.Progress([], MACHINE, max_minutes=0)


def test_the_kernel_suite_measures_only_missing_cases_and_stops_when_out_of_time():
  settings = settings_lib.from_preset("tiny", suite=("kernels",), impls=("scaled_dot",),
                                      seq_lens=(8, 16, 24), head_dims=(8,), heads=(1,),
                                      batch=(1,), causal=(False,), modes=("fwd",),
                                      repeats=3, warmup=0)
  done = {**_case(8), "impl": "scaled_dot", "status": "ok", **MACHINE}
  ticks = iter([0.0, 1.0, 1000.0, 1000.0])  # the third case starts after the deadline
  progress = resume.Progress([done], MACHINE, max_minutes=1.0, clock=lambda: next(ticks))
  written = []
  with pytest.raises(resume.OutOfTime):
    kernels.run(settings, lambda row: written.append(row) or progress.add({**row, **MACHINE}),
                progress)
  assert [r["seq_len"] for r in written] == [16]  # T = 8 skipped, T = 24 not started
  assert written[0]["status"] == "ok" and written[0]["library_implementation"] == "auto"


def _rows(workdir):
  path = os.path.join(workdir, "benchmark.jsonl")
  return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def _command(workdir, *extra):
  return [sys.executable, "-m", "experiments.kernels.run", f"--workdir={workdir}", *ARGS, *extra]


# End to end (three benchmark processes, ~22 s on 2 cores): resuming without
# duplicates is checked in the default suite by
# test_the_kernel_suite_measures_only_missing_cases_and_stops_when_out_of_time and
# test_a_line_cut_by_a_kill_is_skipped_and_good_rows_are_read.
@pytest.mark.slow
def test_a_killed_benchmark_is_completed_by_the_same_command_without_duplicates(tmp_path):
  proc = subprocess.Popen(_command(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 300
  while len(_rows(tmp_path)) < 2 and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)  # no clean-up: as a device command cut at its limit
  proc.wait()
  first = _rows(tmp_path)
  assert 2 <= len(first) < 8, "the kill must come after some rows and before all"
  again = subprocess.run(_command(tmp_path), cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  rows = _rows(tmp_path)
  keys = collections.Counter((r["seq_len"], r["impl"]) for r in rows)
  assert set(keys) == {(t, i) for t in (8, 16, 24, 32) for i in ("scaled_dot", "naive")}
  assert max(keys.values()) == 1  # nothing measured twice
  assert rows[:len(first)] == first  # the killed run's rows kept as they were
  assert "cases were there already" in again.stdout
  # The report holds every case, the killed run's and this one's.
  table = [line for line in open(tmp_path / "benchmark.md") if line.startswith("| ")]
  shown = {(line.split("|")[6].strip(), line.split("|")[1].strip()) for line in table[1:]}
  assert shown == {(str(t), i) for t in (8, 16, 24, 32) for i in ("scaled_dot", "naive")}
  # Everything there: a third call measures nothing and rewrites the same report.
  third = subprocess.run(_command(tmp_path), cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
  assert third.returncode == 0 and len(_rows(tmp_path)) == 8
  assert "appended 0 rows" in third.stdout and "4 cases were there already" in third.stdout


def _errors(proc):
  """The lines of stderr but absl's INFO and WARNING records (JAX's backend search)."""
  return [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith(("I1", "W1"))]


def _row_line(t, impl, **fields):
  return json.dumps({**_case(t), "impl": impl, "status": "ok", "time_median_s": 1e-3,
                     "time_min_s": 1e-3, "time_max_s": 1e-3, **MACHINE, **fields}) + "\n"


_DAMAGED = [
    ('[1, 2]\n', "a JSON list"),
    (_row_line(16, "naive", time_median_s="abc"), "`time_median_s` is 'abc'"),
    (_row_line(16, "naive", status=None), "`status` is None"),
    (_row_line(16, "naive", causal="no"), "`causal`"),
]


def _damaged_file(folder, line):
  path = folder / "benchmark.jsonl"
  path.write_text(_row_line(8, "naive") + '{"suite": "kernels", "impl": "cu\n' + line)
  return path


@pytest.fixture(scope="module")
def report_only_calls(tmp_path_factory, run_refusals):
  """The driver's `main` on every command line of the tests below but the one
  run as a real process, in one process (tests/drivers.py), each
  with a workdir of its own made ready first: name -> (result, workdir, what
  its benchmark.jsonl held before)."""
  calls = {}
  w = tmp_path_factory.mktemp("max_minutes_0")
  calls["max_minutes=0"] = (w / "w", ["--max_minutes=0"])
  for i, (line, _) in enumerate(_DAMAGED):
    w = tmp_path_factory.mktemp(f"damaged{i}")
    _damaged_file(w, line)
    calls[f"damaged{i}"] = (w, ["--report_only"])
  w = tmp_path_factory.mktemp("absent")
  calls["absent workdir"] = (w / "absent", ["--report_only"])
  w = tmp_path_factory.mktemp("other_settings")
  (w / "benchmark.jsonl").write_text(_row_line(64, "naive"))  # T = 64: not of these settings
  calls["other settings"] = (w, ["--report_only"])
  w = tmp_path_factory.mktemp("two_of_eight")
  (w / "benchmark.jsonl").write_text(_row_line(8, "naive") + _row_line(8, "scaled_dot"))
  calls["two of eight"] = (w, ["--report_only"])
  held = {name: (workdir / "benchmark.jsonl").read_text() if workdir.exists() else None
          for name, (workdir, _) in calls.items()}
  results = run_refusals("experiments.kernels.run",
                         [(_command(workdir, *extra)[3:], ROOT)
                          for workdir, extra in calls.values()])
  return {name: (result, workdir, held[name])
          for (name, (workdir, _)), result in zip(calls.items(), results)}


def test_max_minutes_flag_is_checked_before_any_work(report_only_calls):
  p, workdir, _ = report_only_calls["max_minutes=0"]
  assert p.returncode != 0 and "error: `--max_minutes` must be > 0" in p.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("i, needle", [(i, needle) for i, (_, needle) in enumerate(_DAMAGED)])
def test_a_row_of_the_wrong_shape_is_named_with_its_line(tmp_path, report_only_calls, i,
                                                         needle):
  # It crashed the report (a time of "abc" reached the number formatting).
  path = _damaged_file(tmp_path, _DAMAGED[i][0])
  with pytest.raises(ValueError) as info:
    jsonl.read_rows(str(path))
  message = str(info.value)
  assert f"{path} line 3 is damaged" in message and needle in message and "\n" not in message
  # the driver's --report_only on the same file (in a folder of its own)
  proc, workdir, held = report_only_calls[f"damaged{i}"]
  path = workdir / "benchmark.jsonl"
  err = _errors(proc)
  assert proc.returncode == 1 and len(err) == 1 and f"{path} line 3" in err[0], proc.stderr
  assert path.read_text() == held and not (workdir / "benchmark.md").exists()


def test_a_line_cut_by_a_kill_is_skipped_and_good_rows_are_read(tmp_path):
  path = tmp_path / "benchmark.jsonl"
  path.write_text(_row_line(8, "naive") + '{"suite": "kernels", "impl": "cu\n'
                  + _row_line(16, "naive", time_median_s=None, status="skipped"))
  assert [r["seq_len"] for r in jsonl.read_rows(str(path))] == [8, 16]
  assert jsonl.read_rows(str(tmp_path / "none.jsonl")) == []


def test_report_only_without_rows_to_report_is_one_line_and_writes_nothing(
    tmp_path, report_only_calls):
  # It wrote an empty report, said '4 cases were there already' and exited 0.
  # An empty workdir in the process itself; the other calls through `main`.
  proc = subprocess.run(_command(tmp_path, "--report_only"), cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  absent, absent_workdir, _ = report_only_calls["absent workdir"]
  for proc, workdir in ((proc, tmp_path), (absent, absent_workdir)):
    err = _errors(proc)
    assert proc.returncode == 1 and len(err) == 1, proc.stderr
    assert str(workdir / "benchmark.jsonl") in err[0] and "nothing to report" in err[0]
  assert os.listdir(tmp_path) == []  # no folder made, no file written
  assert not absent_workdir.exists()
  # Rows of other settings only (T = 64): still nothing of these settings.
  proc, workdir, held = report_only_calls["other settings"]
  err = _errors(proc)
  assert proc.returncode == 1 and len(err) == 1 and "holds no rows of these settings" in err[0]
  assert not (workdir / "benchmark.md").exists()
  assert (workdir / "benchmark.jsonl").read_text() == held
  # Two of the 8 measurements there: reported as such, the file untouched.
  proc, workdir, held = report_only_calls["two of eight"]
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "wrote benchmark.md from 2 rows" in proc.stdout and "6 measurements" in proc.stdout
  assert "were there already" not in proc.stdout
  assert (workdir / "benchmark.jsonl").read_text() == held and len(_rows(workdir)) == 2


def test_a_benchmark_stopped_by_max_minutes_exits_75_with_its_report(tmp_path):
  # It exited 0, so a script could not tell a stopped run from a complete one.
  proc = subprocess.run(_command(tmp_path, "--max_minutes=0.00001"), cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 75, proc.stderr[-3000:]
  assert "stopped by --max_minutes=1e-05 before a case still to measure (exit status 75)" in (
      proc.stdout)
  assert (tmp_path / "benchmark.md").exists() and len(_rows(tmp_path)) < 8
