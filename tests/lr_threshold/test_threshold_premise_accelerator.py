"""`transformer_lr_premise`: the premise grid for an accelerator, fixed in full
before its first run, read as its members runs and judged with the bands the
CPU premise grid pre-registered."""

import math

import pytest

from attention_jax.sweep import config as config_lib
from experiments.lr_threshold import grids
from experiments.lr_threshold import report as threshold_report
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise_cpu
from tests.lr_threshold import test_threshold as fake
from tests.lr_threshold.test_threshold_members import as_members

CFG, LRS = grids.preset_grids("transformer_lr_premise")["main"]


def test_it_is_the_cpu_premise_recipe_at_more_dims_seeds_and_rates():
  cpu = config_lib.from_preset("transformer_lr_premise_cpu")
  assert CFG.replace(dims=cpu.dims, seeds=cpu.seeds, workers=cpu.workers) == cpu
  assert (CFG.dims, CFG.seeds, CFG.layer_norm, CFG.qk_init) == ((16, 64, 256, 1024), 3,
                                                                "pre", "premise")
  # The quarter-decade ladder from the coarse grid's lowest rate to the ceiling.
  assert LRS[0] == min(premise_cpu.COARSE_RATES) and LRS[-1] == premise_cpu.CEILING
  steps = [math.log10(b / a) for a, b in zip(LRS, LRS[1:])]
  assert len(LRS) == 13 and all(abs(s - 0.25) < 0.02 for s in steps)


# lr*(d) = c d^p, the law the grid is made to follow.
LAW = {"dot": (0.5, -1.0), "scaled_dot": (0.1, -0.5), "inverse_dim": (0.01, 0.0)}


def _loss(score, dim, lr):
  """Falling slowly up to lr*, then well above the rule's target."""
  c, p = LAW[score]
  star = c * dim ** p
  return 2.0 + 0.01 * math.log(star / lr) if lr < star else 2.5


def test_a_grid_that_follows_the_law_holds_within_the_pre_registered_bands(tmp_path):
  for score in CFG.arms:
    for dim in CFG.dims:
      for lr in LRS:
        fake.write_run(tmp_path / "grid", CFG, LRS, score, dim, lr,
                       [_loss(score, dim, lr)] * CFG.seeds)
  as_members(tmp_path / "grid", tmp_path / "members", plan=CFG, lrs=LRS)
  analysis, inputs = threshold_report.read(str(tmp_path / "members"), "",
                                           preset="transformer_lr_premise")
  assert inputs == {"main": str(tmp_path / "members")}
  for score, (_, slope) in LAW.items():
    law = analysis.laws[score]
    assert law.dims == (16, 64, 256, 1024) and law.band == premise_cpu.BANDS[score]
    low, high = law.bracket
    assert low <= slope <= high and law.half_width <= 0.25
    assert law.verdict == "holds", (score, law.bracket)


def test_it_has_no_refinement_to_join(tmp_path):
  with pytest.raises(ValueError, match="--fine: only the transformer_lr_cpu grid"):
    threshold_report.read(str(tmp_path), "", preset="transformer_lr_premise",
                          fine=str(tmp_path))


def test_a_presets_bands_are_those_it_registered_and_none_elsewhere():
  assert grids.preset_bands("transformer_lr_premise") == premise_cpu.BANDS
  assert grids.preset_bands("transformer_lr_premise_cpu") == premise_cpu.BANDS
  assert grids.preset_bands("transformer_lr_cpu") is None
  assert grids.preset_bands("transformer_lr") is None
