"""The threshold analysis of the `transformer_lr` preset's grid: every score in
one workdir per layer norm, its 7 learning rates and 4 d_k, read by
`--preset=transformer_lr --layer_norm=...` (fake runs on disk, as in
test_threshold.py, made from a known lr*(d_k) law per score)."""

import math

import pytest

from experiments.lr_threshold import grids
from experiments.lr_threshold import report as threshold_report
from tests.lr_threshold import test_threshold as fake
from tests.lr_threshold import test_threshold_members

PLAN, LRS = grids.preset_grids("transformer_lr", "pre")["main"]
# lr*(d) = C d^p, the slopes the preset's question compares (all inside the grid).
LAW = {"dot": (0.128, -1.0), "scaled_dot": (0.032, -0.5), "inverse_dim": (3e-3, 0.0),
       "qk_norm": (2e-3, 0.0)}


def lr_star(score, dim):
  c, p = LAW[score]
  return c * dim ** p


def lr_opt(score, dim):
  """The largest grid learning rate at most lr*/2.5 (never the grid's lowest)."""
  return max(lr for lr in LRS if lr <= lr_star(score, dim) / 2.5)


def loss(score, dim, lr, best=2.0):
  """Linear in log lr on each side of lr_opt, at best + margin exactly at lr*."""
  x, x_opt = math.log(lr), math.log(lr_opt(score, dim))
  if x <= x_opt:
    return best + 0.05 * (x_opt - x)
  return best + fake.MARGIN * (x - x_opt) / (math.log(lr_star(score, dim)) - x_opt)


@pytest.fixture(scope="module")
def pre_grid(tmp_path_factory):
  """The pre-LN grid's workdir (as `--layer_norm=pre --sweep=learning_rate=...`
  writes it), every cell finished."""
  path = tmp_path_factory.mktemp("transformer_lr") / "pre"
  for score in PLAN.arms:
    for dim in PLAN.dims:
      for lr in LRS:
        mean = loss(score, dim, lr)
        fake.write_run(path, PLAN, LRS, score, dim, lr, [mean - 0.01, mean, mean + 0.01])
  return path


def test_the_plan_is_every_score_at_every_rate_and_d_k_of_the_layer_norm_asked():
  assert PLAN.layer_norm == "pre" and PLAN.arms == ("dot", "scaled_dot", "inverse_dim",
                                                    "qk_norm")
  assert PLAN.dims == (16, 64, 256, 1024) and LRS == (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
  assert set(grids.preset_grids("transformer_lr")) == {"main"}
  assert grids.preset_grids("transformer_lr")["main"][0].layer_norm == "post"  # the preset's


def test_the_slopes_of_all_four_scores_are_recovered(pre_grid):
  analysis, inputs = threshold_report.read(str(pre_grid), "", "transformer_lr", "pre")
  assert inputs == {"main": str(pre_grid)} and analysis.grid.missing == ()
  assert len(analysis.grid.records) == 4 * 4 * 7 * 3
  for score, (_, p) in LAW.items():
    for dim in PLAN.dims:
      t = analysis.thresholds[(score, dim)]
      assert t.lr_opt == lr_opt(score, dim) and t.fitted
      assert t.lr_star == pytest.approx(lr_star(score, dim), rel=1e-4)
    law = analysis.laws[score]
    assert law.slope == pytest.approx(p, abs=1e-4) and law.dims == PLAN.dims
    assert law.reference == p


def test_its_members_form_reads_as_its_sweep_form(pre_grid, tmp_path):
  test_threshold_members.as_members(pre_grid, tmp_path / "pre", PLAN, LRS)
  members, _ = threshold_report.read(str(tmp_path / "pre"), "", "transformer_lr", "pre")
  sweep, _ = threshold_report.read(str(pre_grid), "", "transformer_lr", "pre")
  assert members.grid.missing == () and members.thresholds == sweep.thresholds
  assert {s: law.slope for s, law in members.laws.items()} == {
      s: law.slope for s, law in sweep.laws.items()}


def test_a_grid_of_the_other_layer_norm_is_refused_naming_the_difference(pre_grid):
  with pytest.raises(ValueError, match="layer_norm: 'pre' there vs 'post' now") as e:
    threshold_report.read(str(pre_grid), "", "transformer_lr", "post")
  # A report's advice, not a training run's ("use another --workdir or delete it").
  assert str(e.value).endswith("it is not a run of this grid: read it with the settings it "
                               "was trained with (--preset, --layer_norm) or point --main / "
                               "--controls at this grid's workdirs.")
  assert "delete" not in str(e.value)


@pytest.mark.parametrize("preset, layer_norm, controls, named", [
    ("transformer_lr", "pre", "C", "--controls: the transformer_lr grid"),
    ("transformer_lr", "middle", "", "--layer_norm: `layer_norm` got 'middle'; allowed values: "
                                     "post, pre."),
    ("quick", "", "", "--preset: 'quick'"),
])
def test_bad_preset_layer_norm_or_controls_are_one_line_naming_the_flag(
    pre_grid, preset, layer_norm, controls, named):
  with pytest.raises(ValueError) as e:
    threshold_report.read(str(pre_grid), controls and str(pre_grid), preset, layer_norm)
  assert str(e.value).startswith(named) and "\n" not in str(e.value)
