"""The gpu sweep's plan from measured times (experiments/benchmarks/calibration.py)
and the final evaluation's time estimate a sweep piece stops before."""

import pytest

from attention_jax.training import evaluation
from experiments.benchmarks import calibration as cal


def _times(step_s=0.02, compile_s=10.0, validation_s=2.0, test_batch_s=0.5, arm="additive",
           dim=1024):
  return cal.CellTimes(arm=arm, dim=dim, build_s=2.0, first_step_s=compile_s + step_s,
                       step_s=step_s, first_validation_s=10.0 + validation_s,
                       validation_s=validation_s, first_test_batch_s=5.0 + test_batch_s,
                       test_batch_s=test_batch_s, test_batch_sentences=128)


def _plan(measured, **kw):
  args = dict(arms=("additive", "multiplicative", "scaled_multiplicative"),
              dims=(128, 256, 512, 1024), pieces=3, piece_minutes=7.0, eval_every=2000,
              checkpoint_every=500, test_sentences=1958, min_steps=1000, max_steps=6000)
  return cal.plan(measured, **{**args, **kw})


def test_cell_seconds_adds_fixed_costs_steps_and_validations():
  t = _times(step_s=0.05, compile_s=30.0, validation_s=4.0, test_batch_s=2.0)
  fixed = 2.0 + 30.0 + 10.0 + 5.0 + 16 * 2.0 + 4.0  # build, compiles, test (16 batches), ppl
  assert cal.cell_seconds(t, 0, eval_every=1000, test_sentences=1958) == pytest.approx(fixed + 4.0)
  assert cal.cell_seconds(t, 3000, eval_every=1000, test_sentences=1958) == pytest.approx(
      fixed + 3000 * 0.05 + 3 * 4.0)


def test_plan_fits_whole_cells_into_the_pieces_from_the_slowest_cell():
  fast, slow = _times(step_s=0.01, arm="multiplicative", dim=128), _times(step_s=0.02)
  plan = _plan([fast, slow])
  assert plan["fits"] and plan["slowest_cell"] == "additive:1024"
  assert plan["cells"] == 12 and plan["cells_per_piece"] == 4
  assert plan["steps"] % 500 == 0 and 1000 <= plan["steps"] <= 6000
  # the slowest cell, four times, fills at most the safe share of a piece ...
  budget = cal.SAFETY * 7 * 60
  assert 4 * plan["predicted_cell_s"] <= budget
  # ... and 500 steps more would not fit
  over = cal.cell_seconds(slow, plan["steps"] + 500, eval_every=plan["eval_every"],
                          test_sentences=1958)
  assert 4 * over > budget
  assert plan["flags"] == [f"--steps={plan['steps']}", f"--eval_every={plan['eval_every']}",
                           "--dims=128,256,512,1024"]


def test_plan_is_capped_by_the_presets_steps_and_drops_dims_when_slow():
  quick = _times(step_s=0.001, compile_s=1.0, validation_s=0.5, test_batch_s=0.1)
  assert _plan([quick])["steps"] == 6000
  slow = _times(step_s=0.06)  # 12 cells would leave < 1,000 steps: 9 do not
  plan = _plan([slow])
  assert plan["fits"] and plan["dims"] == [128, 256, 1024] and plan["cells"] == 9
  hopeless = _times(step_s=5.0)
  plan = _plan([hopeless])
  assert not plan["fits"] and plan["dims"] == [128, 1024]


@pytest.mark.parametrize("text,needle", [("additive", "ARM:DIM"), ("additive:x", "ARM:DIM"),
                                         (",", "empty"), ("dot:0", "ARM:DIM")])
def test_bad_cells_name_the_flag(text, needle):
  with pytest.raises(ValueError, match="--cells") as e:
    cal.parse_cells(text)
  assert needle in str(e.value)


def test_default_cells_are_the_extremes():
  assert cal.default_cells(("additive", "multiplicative", "scaled_multiplicative"),
                           (256, 128, 1024)) == (("additive", 1024),
                                                 ("scaled_multiplicative", 128))


def test_final_evaluation_estimate_scales_the_slowest_validation():
  # 500 greedy validation sentences in 10 s -> 1958 test sentences at beam 10
  assert evaluation.final_evaluation_seconds(10.0, 500, 1, 1958, 10) == pytest.approx(
      10.0 * 1958 * 10 / 500)
  assert evaluation.final_evaluation_seconds(10.0, 500, 1, 100, 1) == 10.0  # never below one
  assert evaluation.final_evaluation_seconds(0.0, 500, 1, 1958, 10) == 0.0  # nothing timed
