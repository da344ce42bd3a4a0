"""A workdir holds one configuration of a sweep (`workdir.check_configuration`):
a driver whose settings or layout differ from those of the runs already
there is refused in one line naming what differs, before anything is made
or written, and every documented extension (more arms, dims, steps or grid
values, a field that changes no number) still goes on. Without it,
`--preset=smoke` trained beside finished `transformer_smoke` runs, and
`--report_only` without the grid's `--sweep` emptied its results.jsonl."""

from __future__ import annotations

import json
import os

import pytest

from attention_jax.analysis import reports
from attention_jax.sweep import config
from attention_jax.sweep import runner
from attention_jax.sweep import workdir as workdir_lib

REFS = ["a b c d", "e f g h", "i j k l"]


def finished_run(workdir: str, cfg: config.ExperimentConfig, arm: config.Arm) -> str:
  """A finished run of `arm` under `cfg` in `workdir`, written by hand as the
  sweep writes one (its settings recorded, result, translations, heat map);
  its folder."""
  run = workdir_lib.Workdir(workdir).run(arm)
  os.makedirs(run.path, exist_ok=True)  # a driver's `_prepare` may have made it
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm)) is None
  rows = [{"arm": arm.name, "dim": arm.attention_dim, "seed": seed, "params": 1000,
           "steps": cfg.steps, "test_bleu": 10.0 + seed, "val_bleu": 9.0, "val_ppl": 3.0,
           "diverged_at_step": None, "diagnostics": {}} for seed in range(cfg.seeds)]
  content = {run.result: rows,
             run.attention: {"src": ["a", "</s>"], "hyp": ["a", "</s>"],
                             "weights": [[1.0, 0.0], [0.0, 1.0]]},
             run.translations: {"references": REFS, "hypotheses": [REFS] * cfg.seeds}}
  for path, value in content.items():
    with open(path, "w") as f:
      json.dump(value, f)
  return run.path


def snapshot(folder) -> dict[str, bytes]:
  """Every file under `folder` with its bytes: what a refused command must leave."""
  out = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, folder)] = f.read()
  return out


def _transformer_workdir(tmp_path) -> str:
  """Finished `transformer_smoke` runs (dot and scaled_dot at d_k 8)."""
  workdir = str(tmp_path / "tsmoke")
  cfg = config.from_preset("transformer_smoke", dims=(8,))
  for arm in cfg.sweep():
    finished_run(workdir, cfg, arm)
  return workdir


def _never_trains(*args, **kwargs):
  raise AssertionError("a refused sweep trained a run")


def test_another_preset_is_refused_in_one_line_naming_the_settings_before_any_work(
    tmp_path, monkeypatch):
  # It trained 6 RNN runs beside the finished Transformer runs, without a word:
  # the refusal fired only where two runs' folders collided.
  workdir = _transformer_workdir(tmp_path)
  before = snapshot(workdir)
  monkeypatch.setattr(runner, "train_group", _never_trains)
  smoke = config.from_preset("smoke", dims=(8,))
  with pytest.raises(ValueError) as info:
    runner.run(smoke, workdir, report=reports.write)
  message = str(info.value)
  assert "\n" not in message and message.startswith(f"`--workdir` {workdir} holds runs made "
                                                    "with other settings")
  assert "model: 'transformer' there vs 'rnn' now" in message
  assert os.path.join(workdir, "runs", "dot_d8") in message
  assert snapshot(workdir) == before  # nothing made, nothing written (no lock either)
  # Another dataset, or other seeds, with everything else the preset's: refused alike.
  for changes, shown in (({"dataset": "reverse"}, "dataset: 'copy' there vs 'reverse' now"),
                         ({"seeds": 3}, "seeds: 2 there vs 3 now")):
    cfg = config.from_preset("transformer_smoke", dims=(8,), arms=("qk_norm",), **changes)
    with pytest.raises(ValueError, match=shown):
      runner.run(cfg, workdir, report=reports.write)
  assert snapshot(workdir) == before


def test_every_documented_extension_still_goes_on(tmp_path):
  """More arms, dims or steps, a field that changes no number, a setting
  recorded before it existed: the same configuration."""
  workdir = str(tmp_path / "w")
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), steps=40, eval_every=20,
                           diag_every=20)
  finished_run(workdir, cfg, config.Arm.of("additive", 8))
  folder = workdir_lib.Workdir(workdir)
  for same in (cfg.replace(arms=("additive", "multiplicative"), dims=(8, 16)),
               cfg.replace(arms=("qk_norm",), dims=(32,)),
               cfg.replace(steps=80),                         # extends the run (`check_run`)
               cfg.replace(arms=("multiplicative",), steps=80),
               cfg.replace(workers=2, log_every=7, max_minutes=5.0, additive_max_dim=8,
                           baseline="additive", data_dir=str(tmp_path / "data"),
                           eval_batch_size=8, eval_memory_gb=1.0)):
    workdir_lib.check_configuration(folder, same)
  # A run recorded before `qk_init` existed ran at its default: no difference.
  path = os.path.join(workdir, "runs", "additive_d8", "config.json")
  with open(path) as f:
    recorded = json.load(f)
  with open(path, "w") as f:
    json.dump({k: v for k, v in recorded.items() if k != "qk_init"}, f)
  workdir_lib.check_configuration(folder, cfg.replace(arms=("multiplicative",)))
  with pytest.raises(ValueError, match="dropout: 0.0 there vs 0.1 now"):
    workdir_lib.check_configuration(folder, cfg.replace(dropout=0.1))


def _grid_workdir(tmp_path, values=(1e-3, 3e-3)) -> tuple[str, config.ExperimentConfig, tuple]:
  """A finished `--sweep=learning_rate=...` grid of one arm, its reports written."""
  workdir = str(tmp_path / "grid")
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,))
  axes = (("learning_rate", values),)
  plan = runner.Plan.of(cfg, workdir, axes, reports.write)
  for job in plan.jobs():
    finished_run(job.point.workdir.path, job.config, job.arm)
  runner.report_only(cfg, workdir, axes, report=reports.write)
  return workdir, cfg, axes


def test_report_only_refuses_a_grid_given_no_sweep_and_writes_nothing(tmp_path):
  # It emptied the grid's results.jsonl and table.md and ended with exit 0.
  workdir, cfg, axes = _grid_workdir(tmp_path)
  rows = open(os.path.join(workdir, "results.jsonl")).read().splitlines()
  assert len(rows) == 2 * cfg.seeds
  before = snapshot(workdir)
  with pytest.raises(ValueError) as info:
    runner.report_only(cfg, workdir, report=reports.write)
  message = str(info.value)
  assert "\n" not in message and message.startswith(
      f"`--workdir` {workdir} holds a --sweep grid over learning_rate (2 grid point "
      "folder(s) such as learning_rate=0.001), not the runs of one sweep: give "
      "--sweep=learning_rate=...")
  # Another axis, or the grid's own but the runs of one sweep given --sweep: refused too.
  with pytest.raises(ValueError, match="holds a --sweep grid over learning_rate .*, not "
                                       "over dropout"):
    runner.report_only(cfg, workdir, (("dropout", (0.0, 0.1)),), report=reports.write)
  assert snapshot(workdir) == before
  point = os.path.join(workdir, "learning_rate=0.001")
  with pytest.raises(ValueError, match=r"holds the runs of one sweep \(.*\), not a --sweep"):
    runner.report_only(cfg, point, axes, report=reports.write)
  assert snapshot(workdir) == before
  # As made, it reports; more grid values than there are folders is a grid extended.
  assert "| learning_rate | additive |" in runner.report_only(cfg, workdir, axes,
                                                              report=reports.write)
  runner.report_only(cfg, workdir, (("learning_rate", (1e-3, 3e-3, 1e-2)),),
                     report=reports.write)


def test_report_only_refuses_a_members_workdir_given_no_members(tmp_path):
  workdir = str(tmp_path / "members")
  cfg = config.from_preset("smoke", arms=("additive",), dims=(8,), seeds=1,
                           members="learning_rate=1e-3,3e-3")
  finished_run(workdir, cfg, config.Arm.of("additive", 8))
  before = snapshot(workdir)
  for other in (cfg.replace(members=""),                      # the preset's own arms too:
                config.from_preset("smoke", seeds=1)):        # no folder collides
    with pytest.raises(ValueError) as info:
      runner.report_only(other, workdir, report=reports.write)
    message = str(info.value)
    assert "\n" not in message and "holds runs made with other settings" in message
    assert "members: 'learning_rate=0.001,0.003' there vs '' now" in message
  assert snapshot(workdir) == before


def test_a_grid_point_on_disk_that_the_grid_does_not_name_is_checked_too(tmp_path):
  workdir, cfg, axes = _grid_workdir(tmp_path, values=(1e-3,))
  # The same axis at another value, of another model family: it would be the
  # grid's second point beside a first of another configuration.
  other = config.from_preset("transformer_smoke", arms=("dot",), dims=(8,))
  with pytest.raises(ValueError, match=r"learning_rate=0.001/runs/additive_d8 \(.*model: "
                                       "'rnn' there vs 'transformer' now"):
    workdir_lib.check_configuration(
        workdir_lib.Workdir(workdir), other, config.grid(other, (("learning_rate", (1e-2,)),)))
  workdir_lib.check_configuration(  # the same configuration at another value: a new point
      workdir_lib.Workdir(workdir), cfg, config.grid(cfg, (("learning_rate", (1e-2,)),)))


def test_the_driver_refuses_in_one_line_and_its_last_line_names_only_what_it_wrote(tmp_path):
  """`experiments.ablation` end to end (the driver's `main` on each command
  line in one process, `tests/drivers.py`)."""
  from tests.drivers import refusals  # pylint: disable=g-import-not-at-top
  tsmoke = _transformer_workdir(tmp_path)
  grid, _, _ = _grid_workdir(tmp_path)
  # Reports beside plots of other runs an earlier command left (the
  # Transformer's kinds.png, a validation.png of runs that logged metrics).
  plain = str(tmp_path / "plain")
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8,))
  for arm in cfg.sweep():
    finished_run(plain, cfg, arm)
  for name in ("kinds.png", "validation.png"):
    with open(os.path.join(plain, name), "wb") as f:
      f.write(b"\x89PNG old")
  os.makedirs(os.path.join(plain, "runs", "additive_d8", "tensorboard", "seed_0"))
  before = {path: snapshot(path) for path in (tsmoke, grid)}
  smoke = ["--preset=smoke", "--arms=additive,multiplicative", "--dims=8"]
  other_preset, no_sweep, reported = refusals("experiments.ablation", [
      (["--preset=smoke", f"--workdir={tsmoke}"], tmp_path),
      ([*smoke, "--report_only", f"--workdir={grid}"], tmp_path),
      ([*smoke, "--report_only", f"--workdir={plain}"], tmp_path)])
  for proc, needle in ((other_preset, "model: 'transformer' there vs 'rnn' now"),
                       (no_sweep, "holds a --sweep grid over learning_rate")):
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: `--workdir` ") and needle in err[0], err
  assert {path: snapshot(path) for path in (tsmoke, grid)} == before
  assert reported.returncode == 0, reported.stderr[-2000:]
  assert reported.stdout.strip().splitlines()[-1] == (
      "wrote ablation.png, attention_additive_8.png, attention_multiplicative_8.png, "
      f"results.jsonl, table.md in {plain}; TensorBoard: tensorboard --logdir={plain} "
      "(each run's tensorboard/ folder)")
