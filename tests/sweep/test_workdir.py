"""The workdir layout, the run identity and the resume/extend rules
(`sweep/workdir.py`, `training/run_folder.py`), and the sweep's plan of jobs
(`sweep/runner.py`)."""

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

from attention_jax.sweep import config
from attention_jax.sweep import runner
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.sweep import workdir_lock
from attention_jax.training import run_folder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_path_has_the_name_existing_workdirs_use():
  """The names are a contract with the workdirs on disk: a renamed file
  would make a finished run look unfinished."""
  w = workdir_lib.Workdir("/w")
  run = w.run(config.Arm.of("scaled_multiplicative", 1024))
  r = "/w/runs/scaled_multiplicative_d1024"
  assert run.path == r
  assert [run.config, run.checkpoints, run.metrics, run.attention, run.translations,
          run.significance, run.result, run.result_of(40)] == [
              f"{r}/config.json", f"{r}/checkpoints", f"{r}/metrics.jsonl",
              f"{r}/attention.json", f"{r}/test_translations.json", f"{r}/significance.json",
              f"{r}/result.json", f"{r}/result.steps40.json"]
  assert [w.results, w.table, w.ablation_plot, w.validation_plot, w.diagnostics_plot,
          w.max_logit_plot, w.sweep_plot("learning_rate"),
          w.attention_plot(config.Arm.of("additive", 8))] == [
              "/w/results.jsonl", "/w/table.md", "/w/ablation.png", "/w/validation.png",
              "/w/diagnostics.png", "/w/max_logit.png", "/w/sweep_learning_rate.png",
              "/w/attention_additive_8.png"]
  point = config.grid(config.ExperimentConfig(), (("learning_rate", (3e-4,)),))[0]
  assert w.point(point).path == "/w/learning_rate=0.0003"
  assert w.lock().path == os.path.join("/w", workdir_lock.LOCK_NAME) == "/w/.lock"


def test_the_fingerprint_is_every_setting_that_changes_numbers_as_json_gives_it_back():
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8, 16))
  fp = workdir_lib.fingerprint(cfg, config.Arm.of("multiplicative", 16))
  fields = set(cfg.to_dict())
  assert set(fp) == fields - set(workdir_lib.RESUMABLE_FIELDS) | {"arm", "dim"}
  assert (fp["arm"], fp["dim"]) == ("multiplicative", 16)
  assert fp == json.loads(json.dumps(fp))  # what config.json holds compares equal
  assert fp["steps"] == cfg.steps and fp["learning_rate"] == cfg.learning_rate
  # Changing one of these must not restart a run: existing workdirs resume under them.
  assert set(workdir_lib.RESUMABLE_FIELDS) == {
      "arms", "dims", "max_minutes", "log_every", "workers", "eval_batch_size",
      "eval_memory_gb", "additive_max_dim", "baseline", "data_dir"}


def test_the_fields_that_change_no_number_are_one_list_for_resuming_and_sweeping(tmp_path):
  # They were two lists that disagreed: naming the default data folder with
  # --data_dir refused a resume although --sweep rejected data_dir as changing
  # nothing, and --sweep=baseline=a,b trained the same runs twice.
  assert (workdir_lib.RESUMABLE_FIELDS == config.UNSWEEPABLE
          == ("arms", "dims") + config.NO_NUMBERS)
  for name in ("data_dir", "additive_max_dim", "baseline"):
    assert name in config.NO_NUMBERS
    with pytest.raises(ValueError, match=f"cannot vary `{name}`: it does not change"):
      config.parse_axis(f"{name}=a,b" if name != "additive_max_dim" else f"{name}=8,16")
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8,))
  arm = config.Arm.of("additive", 8)
  run = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run.path)
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm)) is None
  for changes in ({"data_dir": str(tmp_path / "data")}, {"baseline": "multiplicative"},
                  {"additive_max_dim": 8}):
    resumed = workdir_lib.fingerprint(cfg.replace(**changes), arm)
    assert workdir_lib.check_run(run, resumed) is None
  # A folder made when data_dir was part of a run's identity resumes too.
  with open(run.config) as f:
    recorded = json.load(f)
  with open(run.config, "w") as f:
    json.dump({**recorded, "data_dir": "/elsewhere"}, f)
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm)) is None


def test_additive_max_dim_and_baseline_leave_every_run_as_it_is():
  # `additive_max_dim` only drops runs, `baseline` only chooses what the
  # tables compare: the runs a sweep keeps are the same runs, of the same settings.
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8, 16))
  plans = {changes: {job.arm: workdir_lib.fingerprint(job.config, job.arm)
                     for job in runner.Plan.of(cfg.replace(**dict(changes)), "/w").jobs()}
           for changes in ((), (("additive_max_dim", 8),), (("baseline", "multiplicative"),))}
  everything = plans[()]
  assert len(everything) == 4
  assert set(everything) - set(plans[(("additive_max_dim", 8),)]) == {
      config.Arm.of("additive", 16)}
  for kept in plans.values():
    assert all(everything[arm] == fp for arm, fp in kept.items())
  assert plans[(("baseline", "multiplicative"),)] == everything


def test_the_same_data_prepared_in_two_folders_is_the_same_data(tmp_path):
  # Why `data_dir` changes no number: the examples and the tokenizer of a
  # preparation depend on the dataset and the vocabulary size, not on the folder.
  from attention_jax.data import input_pipeline
  from attention_jax.data import tfds_prep
  from tests.data.test_bible import ToyPairs
  from tests.data.test_tokenizer import _corpus
  prepared = []
  for folder in (tmp_path / "one", tmp_path / "two"):
    folder.mkdir()
    builder = tfds_prep.ensure_prepared(
        lambda folder=folder: ToyPairs(data_dir=str(folder), file_format="array_record"),
        lock_dir=folder)
    path = folder / "toy_pairs" / "tokenizers" / "1.0.0-bpe400.model"
    tokenizer = input_pipeline.load_tokenizer(builder, path, _corpus, 400, lock_dir=folder)
    examples = {split: [dict(e) for e in source]
                for split, source in builder.as_data_source().items()}
    prepared.append((examples, tokenizer.sha256))
  assert prepared[0][0]["train"] and prepared[0] == prepared[1]


def test_the_committed_grid_runs_still_match_the_command_that_made_them():
  """Every run folder of results/lr_cpu (made by older code) is accepted as it
  is by the command of its README: same folder, same settings."""
  folders = sorted(glob.glob(os.path.join(ROOT, "results", "lr_cpu", "learning_rate=*")))
  if not folders:
    pytest.skip("results/lr_cpu is not in this checkout")
  cfg = config.from_preset("quick", steps=2500, dims=(128, 1024),
                           arms=("additive", "multiplicative", "scaled_multiplicative",
                                 "qk_norm"))
  plan = runner.Plan.of(cfg, os.path.join(ROOT, "results", "lr_cpu"),
                       (("learning_rate", (3e-4, 1e-3, 3e-3)),))
  jobs = plan.jobs()
  assert len(jobs) == 24 and {j.point.workdir.path for j in jobs} == set(folders)
  for job in jobs:
    assert job.run.finished, job.run.path
    fp = workdir_lib.fingerprint(job.config, job.arm)
    assert workdir_lib.check_run(job.run, fp, write=False) is None


def test_a_new_folder_records_its_settings_and_refuses_others(tmp_path):
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,))
  arm = config.Arm.of("additive", 8)
  run = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run.path)
  fp = workdir_lib.fingerprint(cfg, arm)
  assert workdir_lib.check_run(run, fp) is None
  with open(run.config) as f:
    assert f.read() == json.dumps(fp, indent=1, sort_keys=True)
  assert workdir_lib.check_run(run, fp) is None  # the same settings: resumed
  bookkeeping = workdir_lib.fingerprint(cfg.replace(workers=2, log_every=7), arm)
  assert workdir_lib.check_run(run, bookkeeping) is None
  with pytest.raises(ValueError, match="learning_rate") as info:
    workdir_lib.check_run(run, workdir_lib.fingerprint(cfg.replace(learning_rate=0.5), arm))
  assert run.path in str(info.value)


def test_a_folder_made_before_a_setting_existed_ran_at_its_default(tmp_path):
  # `qk_init` came after runs were recorded: their config.json lacks it, and
  # they ran at its default, 'glorot'; another value is another run.
  cfg = config.from_preset("transformer_smoke", arms=("dot",), dims=(8,))
  arm = config.Arm.of("dot", 8)
  run = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run.path)
  fp = workdir_lib.fingerprint(cfg, arm)
  assert fp["qk_init"] == "glorot"
  with open(run.config, "w") as f:
    json.dump({k: v for k, v in fp.items() if k != "qk_init"}, f)
  assert workdir_lib.check_run(run, fp) is None
  premise = workdir_lib.fingerprint(cfg.replace(qk_init="premise"), arm)
  with pytest.raises(ValueError, match="qk_init: 'glorot' there vs 'premise' now"):
    workdir_lib.check_run(run, premise)


def test_a_longer_run_extends_a_finished_one_and_keeps_its_result(tmp_path):
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), steps=40, eval_every=20,
                           diag_every=20, schedule="constant")
  arm = config.Arm.of("additive", 8)
  run = workdir_lib.Workdir(str(tmp_path)).run(arm)
  os.makedirs(run.path)
  workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm))
  with open(run.result, "w") as f:
    json.dump([{"seed": 0}], f)
  longer = workdir_lib.fingerprint(cfg.replace(steps=80), arm)
  assert workdir_lib.check_run(run, longer, write=False) == 40
  workdir_lib.extend_run(run, longer, 40)
  assert not run.finished
  with open(run.result_of(40)) as f:
    assert json.load(f) == [{"seed": 0}]
  assert workdir_lib.check_run(run, longer) is None  # now a run of 80 steps
  with pytest.raises(ValueError, match="cannot be shortened"):
    workdir_lib.check_run(run, workdir_lib.fingerprint(cfg.replace(steps=60), arm))


def test_the_plan_hands_out_one_job_per_arm_of_each_point():
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8, 16),
                           additive_max_dim=8)
  flat = runner.Plan.of(cfg, "/w").jobs()
  assert [j.arm for j in flat] == list(cfg.sweep()) and len(flat) == 3
  assert [j.label for j in flat] == ["additive d=8", "multiplicative d=8",
                                     "multiplicative d=16"]
  assert flat[2].run.path == "/w/runs/multiplicative_d16"
  grid = runner.Plan.of(cfg, "/w", (("learning_rate", (1e-3, 3e-3)),)).jobs()
  assert len(grid) == 6
  assert grid[3].label == "learning_rate=0.003 additive d=8"
  assert grid[3].run.path == "/w/learning_rate=0.003/runs/additive_d8"
  assert grid[3].config.learning_rate == 3e-3


def test_a_refused_grid_point_lock_releases_the_locks_taken_before_it(tmp_path):
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,))
  plan = runner.Plan.of(cfg, str(tmp_path), (("learning_rate", (1e-3, 3e-3)),))
  busy = plan.points[1].workdir.path
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
      import sys, time
      from attention_jax.sweep import workdir_lock
      with workdir_lock.WorkdirLock({busy!r}, log=lambda _: None):
        print("held", flush=True)
        time.sleep(60)
      """)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workdir_lock.WorkdirBusyError, match=busy):
      with plan.locks(log=lambda _: None):
        pass
    # The workdir's own lock and the first point's were let go.
    for workdir in (plan.workdir, plan.points[0].workdir):
      with workdir.lock(log=lambda _: None):
        pass
  finally:
    holder.kill()
    holder.wait()
