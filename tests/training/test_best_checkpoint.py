"""Which parameters a member keeps as its best: higher validation BLEU, and at
equal BLEU lower validation perplexity; and the checkpoint fields behind it."""

import json
import math
import types

import jax.numpy as jnp
import numpy as np

from attention_jax.training import actions, run_config, state as state_lib
from attention_jax.training.placement import Placement


def test_a_tie_in_bleu_goes_to_the_lower_perplexity():
  best_bleu, best_ppl = np.array([5.0, 5.0, 5.0, 5.0, 5.0]), np.array([50.0] * 5)
  scores = np.array([5.0, 5.0, 5.0, 6.0, 4.0])
  ppl = np.array([40.0, 60.0, 50.0, 70.0, 10.0])
  # tie and lower; tie and higher; tie and equal; higher BLEU, worse perplexity;
  # lower BLEU, better perplexity
  np.testing.assert_array_equal(actions.improved(scores, ppl, best_bleu, best_ppl),
                                [True, False, False, True, False])


def test_nan_is_never_better_and_a_new_member_takes_its_first_validation():
  nan = np.nan
  # a diverged member's NaN score; a best perplexity not known (an older
  # checkpoint) with tied BLEU; a fresh member (-1, +inf) scoring 0
  np.testing.assert_array_equal(
      actions.improved(np.array([nan, 3.0, 0.0]), np.array([nan, 1.0, 900.0]),
                       np.array([2.0, 3.0, -1.0]), np.array([9.0, nan, np.inf])),
      [False, False, True])


def _validating(scores_and_ppl):
  """`RunActions.validate` over a fixed series of validations of two
  members (its evaluator and trainer faked), from a fresh state; each
  validation's parameters are its index, so `best_params` names the one kept."""
  series = iter(scores_and_ppl)
  trainer = types.SimpleNamespace(
      check_params=lambda state, log: state, placement=Placement(None), seeds=(0, 1),
      members=run_config.members((0, 1)))
  run = object.__new__(actions.RunActions)
  run.trainer, run.label, run.slowest_validation, run.log = trainer, "t", 0.0, lambda _: None
  run.evaluator = types.SimpleNamespace(validate=lambda params, ok: next(series))
  run.metrics = types.SimpleNamespace(append=lambda row: None)
  state = state_lib.TrainState(
      params=None, opt_state=None, best_params={"w": jnp.full((2,), -1.0)},
      best_bleu=np.full(2, -1.0), best_step=np.zeros(2, np.int64),
      diverged_at=np.zeros(2, np.int64), loss=np.zeros(2), best_ppl=np.full(2, np.inf))
  for i in range(len(scores_and_ppl)):
    state = state.replace(step=100 * (i + 1), params={"w": jnp.full((2,), float(i))})
    state, stop = run.validate(state)
    assert stop is None
  return state


def test_validate_keeps_the_tied_checkpoint_of_lower_perplexity():
  """Member 0 scores BLEU 0 three times with perplexity 900, 500, 700: the
  second is kept (the first was kept before ties were broken). Member 1's
  BLEU rises, so its perplexity does not matter."""
  state = _validating([(np.array([0.0, 1.0]), np.array([900.0, 900.0])),
                       (np.array([0.0, 2.0]), np.array([500.0, 950.0])),
                       (np.array([0.0, 3.0]), np.array([700.0, 990.0]))])
  np.testing.assert_array_equal(state.best_step, [200, 300])
  np.testing.assert_array_equal(np.asarray(state.best_params["w"]), [1.0, 2.0])
  np.testing.assert_array_equal(state.best_bleu, [0.0, 3.0])
  np.testing.assert_array_equal(state.best_ppl, [500.0, 990.0])


def _state(best_ppl):
  return state_lib.TrainState(
      params=None, opt_state=None, best_params=None, best_bleu=np.array([0.0, 7.5, -1.0]),
      best_step=np.array([300, 200, 0]), diverged_at=np.zeros(3, np.int64),
      loss=np.zeros(3), best_ppl=np.asarray(best_ppl, np.float64), step=400)


def test_the_best_perplexity_goes_through_a_checkpoints_strict_json():
  state = _state([812.5, np.nan, np.inf])
  meta = state.meta()
  text = json.dumps(meta, allow_nan=False)  # strict JSON: no inf, no NaN
  back = state.restored({"params": 1, "opt_state": 2, "best_params": 3}, json.loads(text))
  assert meta["best_ppl"] == [812.5, "nan", "inf"]
  np.testing.assert_array_equal(back.best_ppl, state.best_ppl)  # NaN in the same place
  assert back.step == 400 and back.params == 1


def test_an_older_checkpoint_without_best_perplexities_still_loads():
  """Written before ties were broken: its meta has no `best_ppl`. The
  metrics log gives the perplexity at each member's best step where it
  holds one; a member with no validation yet starts as a new one (+inf);
  one the log does not cover is not known (NaN), and then a later tie keeps
  its best, the rule it was trained under."""
  old = {k: v for k, v in _state([1.0, 1.0, 1.0]).meta().items() if k != "best_ppl"}
  history = [{"step": 300, "seed": 0, "val_bleu": 0.0, "val_ppl": 812.5},
             {"step": 300, "seed": 1, "val_bleu": 7.1, "val_ppl": 90.0},
             {"step": 300, "seed": 0, "logit_std": 2.0},
             {"step": 100, "seed": 0, "val_bleu": 0.0, "val_ppl": 2000.0}]
  filled = state_lib.with_logged_best_ppl(old, history, (0, 1, 2))
  assert filled["best_ppl"] == [812.5, None, "inf"]  # seed 1's best step 200 is not logged
  fresh = _state([np.inf] * 3)
  np.testing.assert_array_equal(
      fresh.restored({"params": 1, "opt_state": 2, "best_params": 3}, filled).best_ppl,
      [812.5, np.nan, np.inf])
  # with no log at all, the meta as it was still loads: every member not known
  bare = fresh.restored({"params": 1, "opt_state": 2, "best_params": 3}, old)
  assert all(math.isnan(x) for x in bare.best_ppl)
  np.testing.assert_array_equal(bare.best_bleu, [0.0, 7.5, -1.0])
  np.testing.assert_array_equal(bare.best_step, [300, 200, 0])
  # a meta that has its perplexities is left as it is
  assert state_lib.with_logged_best_ppl(filled, [], (0, 1, 2)) is filled
