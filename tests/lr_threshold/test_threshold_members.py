"""The learning-rate threshold analysis reads a grid trained as members
(`--members=learning_rate=...`: one run per score and d_k) as it reads the
`--sweep` grid of the same runs."""

import os

import pytest

from experiments.lr_threshold import grids
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir as workdir_lib
from attention_jax import files
from attention_jax.training.metrics_log import MetricsLog
from experiments.lr_threshold import report as threshold_report
from tests.lr_threshold import test_threshold as fake

MAIN, LRS = fake.MAIN, fake.LRS


def as_members(grid_path, out, plan=MAIN, lrs=LRS):
  """The fake `--sweep` grid at `grid_path` rewritten as the workdir of one
  members run per score and d_k: each run's metrics-log lines and rows those
  of every learning rate's run, values outer (the trainer's member order),
  each naming its learning rate; its config.json that of `--members`."""
  grid, members = workdir_lib.Workdir(str(grid_path)), workdir_lib.Workdir(str(out))
  cfg = grids.members_config(plan, lrs)
  for arm in cfg.sweep():
    run = members.run(arm)
    os.makedirs(run.path)
    assert workdir_lib.check_run(run, workdir_lib.fingerprint(cfg, arm)) is None
    lines, rows = [], []
    for point in config_lib.grid(plan, ((grids.AXIS, lrs),)):
      alone = grid.point(point).run(arm)
      lr = {grids.AXIS: point.values[grids.AXIS]}
      lines += [{"step": r["step"], "seed": r["seed"], **lr, **r}
                for r in MetricsLog(alone.metrics, write=False).read()]
      rows += [{**r, **lr} for r in alone.rows()] if alone.finished else []
    lines.sort(key=lambda r: r["step"])  # the trainer logs every member at each step
    files.atomic_write(run.metrics, "".join(files.to_json(r) + "\n" for r in lines))
    if len(rows) == len(lrs) * plan.seeds:
      files.atomic_write(run.result, files.to_json(rows))


def test_a_members_grid_is_read_as_the_sweep_grid_of_the_same_runs(tmp_path):
  fake.write_main(tmp_path / "grid", partial={("scaled_dot", 16, 1e-2)})
  as_members(tmp_path / "grid", tmp_path / "members")
  assert grids.is_members_workdir(str(tmp_path / "members"), MAIN, LRS)
  assert not grids.is_members_workdir(str(tmp_path / "grid"), MAIN, LRS)
  grid = grids.read_grid(str(tmp_path / "grid"), MAIN, LRS)
  members = grids.read_grid(str(tmp_path / "members"), MAIN, LRS)
  # The unfinished run leaves every learning rate of its members run without a
  # result row; a cell's outcome is its last validation, which the others have.
  assert grid.missing == (grids.Cell("scaled_dot", 16, 1e-2),)
  assert set(members.missing) == set(grid.missing)
  key = lambda r: (r.cell, r.seed)
  finished = {key(r): r for r in grid.records}
  read = {key(r): r for r in members.records}
  assert set(read) == set(finished)
  for k, r in read.items():
    if r.score == "scaled_dot" and r.dim == 16:  # its result rows are not there
      assert r.loss == finished[k].loss and r.diagnostics == finished[k].diagnostics
    else:
      assert r == finished[k]
  # The driver takes it for --main.
  assert threshold_report.grid_problem("--main", str(tmp_path / "members"), MAIN, LRS) is None


def test_a_members_run_of_another_list_is_refused_naming_its_config(tmp_path):
  fake.write_main(tmp_path / "grid")
  as_members(tmp_path / "grid", tmp_path / "members")
  with pytest.raises(ValueError, match="config.json|members"):
    grids.read_grid(str(tmp_path / "members"), MAIN, LRS[:-1])
