"""`workers.run_in_workers` with toy jobs: a worker that dies or a run that
fails is named, the other runs finish and are reported, and the driver never
waits forever (it used to: a killed worker's task was never answered)."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

from attention_jax.sweep import workers
from attention_jax.training import interrupts


@dataclasses.dataclass(frozen=True)
class ToyJob:
  label: str
  action: str  # 'ok', 'die', 'fail', 'bug', 'slow', 'paused'
  folder: str


def toy_train(job: ToyJob, *, log, deadline) -> bool:
  """Sent to the workers by name: does what `job.action` says."""
  del deadline
  log(f"[{job.label}] started in {os.getpid()}")
  if job.action == "die":  # what the out-of-memory killer does
    os.kill(os.getpid(), signal.SIGKILL)
  if job.action == "fail":
    raise ValueError(f"{job.folder}/metrics.jsonl is not a file")
  if job.action == "bug":
    raise KeyError("no such thing")
  if job.action == "slow":  # a run that checks for a stop after each 'step'
    for _ in range(200):
      time.sleep(0.05)
      interrupts.check()
  with open(os.path.join(job.folder, job.label), "w") as f:
    f.write(str(os.getpid()))
  return job.action != "paused"


def _run(tmp_path, actions, workers_count=2, **kwargs):
  jobs = [ToyJob(f"job{i}", a, str(tmp_path)) for i, a in enumerate(actions)]
  reported, lines = [], []
  start = time.time()
  try:
    return workers.run_in_workers(workers_count, jobs, toy_train, None,
                                  lambda job: reported.append(job.label),
                                  log=lines.append, **kwargs), reported, lines
  finally:
    assert time.time() - start < 120  # never hangs


def test_every_job_runs_and_is_reported(tmp_path):
  finished, reported, lines = _run(tmp_path, ["ok", "ok", "ok"])
  assert finished and sorted(reported) == ["job0", "job1", "job2"] and not lines
  assert sorted(os.listdir(tmp_path)) == ["job0", "job1", "job2"]


def test_a_paused_job_makes_the_sweep_unfinished(tmp_path):
  finished, reported, _ = _run(tmp_path, ["ok", "paused"])
  assert not finished and sorted(reported) == ["job0", "job1"]


def test_a_killed_worker_is_named_and_the_other_runs_finish(tmp_path):
  with pytest.raises(workers.RunsFailed) as e:
    _run(tmp_path, ["die", "ok", "ok", "ok"])
  message = str(e.value)
  assert message.startswith("1 of 4 runs failed: [job0] its worker process was killed by "
                            "SIGKILL (the kernel's out-of-memory killer")
  assert "re-run the same command" in message and "\n" not in message
  # The three others ran (the dead worker was replaced) and were reported.
  assert sorted(os.listdir(tmp_path)) == ["job1", "job2", "job3"]


def test_a_failing_run_does_not_stop_the_others_and_is_one_line(tmp_path):
  with pytest.raises(workers.RunsFailed) as e:
    _run(tmp_path, ["fail", "slow", "bug"])
  message = str(e.value)
  assert f"[job0] {tmp_path}/metrics.jsonl is not a file" in message
  assert "[job2] KeyError: 'no such thing'" in message
  assert message.startswith("2 of 3 runs failed")
  assert os.listdir(tmp_path) == ["job1"]  # the slow run was not cut short


def test_a_stop_reaches_the_running_workers_after_a_death(tmp_path, monkeypatch):
  """SIGTERM while a worker is dead and another runs: the running one stops
  after its 'step' and the driver raises Interrupted (it used to ignore the
  first SIGTERM, blocked on the dead worker's answer)."""
  monkeypatch.setattr(interrupts, "_received", {"signum": None, "event": None})
  interrupts.install()
  try:
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    signal.alarm(6)  # after the workers have started (spawned Python + imports)
    with pytest.raises(interrupts.Interrupted) as e:
      _run(tmp_path, ["die", "slow", "ok", "ok"])
    assert e.value.signum == signal.SIGTERM
  finally:
    signal.alarm(0)
    for signum in (*interrupts.SIGNALS, signal.SIGALRM):
      signal.signal(signum, signal.SIG_DFL)
  assert "job1" not in os.listdir(tmp_path)  # stopped, not finished


@pytest.mark.parametrize("code,needle", [
    (-9, "killed by SIGKILL (the kernel's out-of-memory killer"),
    (-15, "killed by SIGTERM"),
    (1, "exited with status 1"),
])
def test_how_a_worker_died_is_said_in_words(code, needle):
  assert needle in workers.death(code)
