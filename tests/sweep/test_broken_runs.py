"""One run's damaged file stops no other run: the reports read around it and
name it, and the sweep ends with "N of M runs failed" and the reasons
(`reports.write`, `runner.Plan.report`, `workers.run_in_workers`); a
committed run's damaged file is to be restored, not deleted, and a run that
would be trained again from step 1 while its metrics log holds steps no
checkpoint holds is refused (`workdir.restated`, `workdir.check_retraining`)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from attention_jax.analysis import reports
from attention_jax.sweep import config
from attention_jax.sweep import runner
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.sweep import workers
from attention_jax.training import interrupts
from tests.sweep.test_one_configuration import finished_run
from tests.sweep.test_one_configuration import snapshot

ARMS = ("additive", "multiplicative")


def _cfg(**changes) -> config.ExperimentConfig:
  return config.from_preset("smoke", **{"arms": ARMS, "dims": (8,), **changes})


def _finished(tmp_path) -> tuple[str, config.ExperimentConfig]:
  workdir = str(tmp_path / "w")
  cfg = _cfg()
  for arm in cfg.sweep():
    finished_run(workdir, cfg, arm)
  return workdir, cfg


def _rows(workdir):
  with open(os.path.join(workdir, "results.jsonl")) as f:
    return [json.loads(line) for line in f]


# --- the reports read around a broken run and name it ------------------------------

def test_the_reports_leave_out_a_run_with_a_damaged_file_and_name_it(tmp_path):
  # The report raised on the first damaged file, before its table was written.
  workdir, cfg = _finished(tmp_path)
  damaged = os.path.join(workdir, "runs", "additive_d8", "result.json")
  with open(damaged, "w") as f:
    f.write('[{"seed": 0')
  with pytest.raises(workdir_lib.UnreadableRuns) as info:
    reports.write(workdir_lib.Workdir(workdir), cfg)
  assert list(info.value.problems) == [os.path.dirname(damaged)]
  message = str(info.value)
  assert "\n" not in message and message.startswith("1 run is left out of the reports: "
                                                     f"{damaged} is damaged (not JSON")
  # The other run is reported, and the table says which run it leaves out.
  assert {(r["arm"], r["seed"]) for r in _rows(workdir)} == {("multiplicative", 0),
                                                             ("multiplicative", 1)}
  table = open(os.path.join(workdir, "table.md")).read()
  assert "10.50 ± 0.71 (11.00)" in table and info.value.table == table
  assert table.rstrip().endswith(f"Left out, their files unreadable (the driver names each "
                                 f"with what to do): {os.path.dirname(damaged)}.")
  assert "additive − " not in table and "multiplicative − additive" not in table


def test_a_damaged_baseline_translation_is_named_once_and_the_rest_reported(tmp_path):
  workdir, cfg = _finished(tmp_path)
  damaged = os.path.join(workdir, "runs", "additive_d8", "test_translations.json")
  with open(damaged, "w") as f:
    f.write('{"references": 3')
  with pytest.raises(workdir_lib.UnreadableRuns) as info:
    reports.write(workdir_lib.Workdir(workdir), cfg)
  assert list(info.value.problems) == [os.path.dirname(damaged)]
  assert damaged in str(info.value) and "damaged" in str(info.value)
  assert len(_rows(workdir)) == 4  # its rows read: only the test against it is left out


def _fake_train(cfg, run, arm, label, log) -> bool:
  """Stands in for training the run of `arm` in the folder `run`: writes its
  files as a finished run (the additive run's result.json damaged, as a bad
  disk or hand leaves one); the multiplicative run takes 4 s, checking for a
  stop every 0.05 s as a run does after each step."""
  if arm.name == "multiplicative":
    for _ in range(80):
      time.sleep(0.05)
      interrupts.check()
  finished_run(os.path.dirname(os.path.dirname(run.path)), cfg, arm)
  if arm.name == "additive":
    with open(run.result, "w") as f:
      f.write("\x00" * 16)
  log(f"[{label}] trained")
  return True


def fake_train_job(job, *, log, deadline) -> bool:
  """`runner.train_job` in a `--workers` process (sent there by name)."""
  del deadline
  return _fake_train(job.config, job.run, job.arm, job.label, log)


def fake_train_group(cfg, run_dir, arm, data, *, mesh, log, deadline, label,
                     sweep=None) -> bool:
  """`runner.train_group` in the driver (one run after another)."""
  del data, mesh, deadline, sweep
  return _fake_train(cfg, run_dir, arm, label, log)


@pytest.mark.parametrize("workers_count", [1, 2])
def test_a_damaged_file_of_one_run_stops_no_other_and_the_sweep_says_n_of_m_failed(
    tmp_path, monkeypatch, workers_count):
  # With --workers, the report's error set the stop event: the other run
  # stopped with a false "SIGTERM: checkpoint saved" line, and the driver
  # ended on the file's error instead of "1 of 2 runs failed".
  monkeypatch.setattr(runner, "train_job", fake_train_job)
  monkeypatch.setattr(runner, "train_group", fake_train_group)
  workdir = str(tmp_path / "w")
  lines = []
  with pytest.raises(workers.RunsFailed) as info:
    runner.run(_cfg(workers=workers_count), workdir, report=reports.write, log=lines.append)
  message = str(info.value)
  damaged = os.path.join(workdir, "runs", "additive_d8", "result.json")
  assert message.startswith(f"1 of 2 runs failed: [additive d=8] {damaged} is damaged "
                            "(not JSON")
  assert "\n" not in message
  assert not any("SIGTERM" in line or "checkpoint saved" in line for line in lines), lines
  named = [l for l in lines if l.startswith("[additive d=8] left out of the reports")]
  assert len(named) == 1 and damaged in named[0], lines  # named once, as it was found
  # The other run finished and is reported.
  assert os.path.exists(os.path.join(workdir, "runs", "multiplicative_d8", "result.json"))
  assert {r["arm"] for r in _rows(workdir)} == {"multiplicative"}


# --- a committed run's files are restored, never trained again ------------------------

def _git(folder, *args):
  subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_a_committed_runs_damaged_translations_are_to_be_restored_not_deleted(tmp_path):
  # "delete it and that run's result.json, and re-run" retrained such a run
  # (it keeps no checkpoints) from step 1 and cut its metrics log.
  workdir, cfg = _finished(tmp_path)
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "add", ".")
  damaged = os.path.join(workdir, "runs", "multiplicative_d8", "test_translations.json")
  with open(damaged, "w") as f:
    f.write("[1, 2")
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert "\n" not in message and f"{damaged} is damaged (not JSON" in message
  assert message.endswith(f"; restore it with `git checkout -- {damaged}` (it is committed).")
  assert "delete" not in message and "re-run" not in message


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_copied_runs_file_is_to_be_restored_unless_its_run_keeps_a_checkpoint(
    tmp_path, checkpoint):
  workdir, cfg = _finished(tmp_path)  # no git here: a run copied, not committed
  run = workdir_lib.Workdir(workdir).run(config.Arm.of("multiplicative", 8))
  if checkpoint:
    os.makedirs(os.path.join(run.checkpoints, "120"))
  with open(run.result, "w") as f:
    json.dump([], f)
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert f"{run.result} is damaged (it holds no rows)" in message
  if checkpoint:  # evaluated again from its last checkpoint: the usual remedy holds
    assert message.endswith("delete it and re-run the same command to evaluate that run again "
                            "from its last checkpoint.")
  else:
    assert message.endswith(
        f"; restore it from where the run was copied (`git checkout -- {run.result}` where "
        "it is committed): the run keeps no checkpoints, so deleting it and re-running "
        "would train the run again from step 1.")


def _logged(run, last_step: int, every: int = 20) -> None:
  with open(run.metrics, "w") as f:
    for step in range(every, last_step + 1, every):
      f.write(json.dumps({"step": step, "seed": 0, "loss": 1.0}) + "\n")


def test_a_finished_run_without_checkpoint_is_not_trained_again(tmp_path, monkeypatch):
  # Its result.json deleted as a remedy once said, a committed run (no
  # checkpoints) was trained again from step 1, its metrics log cut.
  workdir, cfg = _finished(tmp_path)
  run = workdir_lib.Workdir(workdir).run(config.Arm.of("multiplicative", 8))
  _logged(run, cfg.steps)
  os.remove(run.result)
  before = snapshot(workdir)
  monkeypatch.setattr(runner, "train_group", lambda *a, **k: pytest.fail("trained again"))
  with pytest.raises(ValueError) as info:
    runner.run(cfg, workdir, report=reports.write, log=lambda line: None)
  assert str(info.value) == (
      f"{run.path} was finished (test_translations.json is there) but has no result.json and "
      "no checkpoint: training it would start again from step 1 and cut its metrics log, "
      f"which holds steps up to {cfg.steps}; restore the run's files (`git checkout -- "
      f"{run.path}` where it is committed), or delete {run.metrics} to train the run again "
      "from scratch.")
  assert snapshot(workdir) == before  # refused before anything was made or written
  # A finished run without checkpoint asked for more steps: the same, before it is extended.
  finished = workdir_lib.Workdir(workdir).run(config.Arm.of("additive", 8))
  with pytest.raises(ValueError) as info:
    runner.run(cfg.replace(steps=240, arms=("additive",)), workdir, report=reports.write)
  assert str(info.value) == (
      f"{finished.path} is finished at {cfg.steps} steps but has no checkpoint to extend it "
      f"from: --steps=240 would train it again from step 1 and cut its metrics log; keep "
      f"--steps={cfg.steps} for it (restore its checkpoints where they were kept), or delete "
      f"the folder {finished.path} to train the run of 240 steps from scratch.")
  assert snapshot(workdir) == before  # its result not moved aside


@pytest.mark.parametrize("last_step", [40, 80])
def test_an_unfinished_run_without_checkpoint_starts_over_and_says_so_unless_committed(
    tmp_path, monkeypatch, last_step):
  # What a kill before the first checkpoint leaves (40: between the log line
  # and the save), or a copy without the checkpoints (80: scripts/gpu_run.sh
  # over SWEEP_STATE_MIB): a re-run starts it again, as it always did, and says so.
  workdir = str(tmp_path / "w")
  cfg = _cfg(arms=("additive",))
  run = workdir_lib.Workdir(workdir).run(config.Arm.of("additive", 8))
  os.makedirs(run.path)
  workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, config.Arm.of("additive", 8)))
  _logged(run, last_step)
  trained, lines = [], []
  monkeypatch.setattr(runner, "train_group",
                      lambda *a, **k: trained.append(a[1].path) or False)  # paused at once
  assert runner.run(cfg, workdir, report=reports.write, log=lines.append) is None
  assert trained == [run.path]
  assert ("[additive d=8] no checkpoint: training starts again from step 1 (its metrics log, "
          f"up to step {last_step}, is rewritten)") in lines
  # Committed (git tracks its log), the same run is refused: it was copied without them.
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "add", ".")
  with pytest.raises(ValueError, match=f"{run.path} is committed but has no result.json and "
                                       "no checkpoint: training it would start again"):
    runner.run(cfg, workdir, report=reports.write)
