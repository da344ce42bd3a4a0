"""The progress line's ETA: steady-state steps and the evaluations to come."""

import pytest

from attention_jax.training import actions


def test_eta_counts_steps_validations_due_and_the_final_test():
  # At step 250 of 1,000 with validation every 250: 750 steps, 3 validations
  # (500, 750, 1,000) and the final test.
  assert actions.eta_seconds(250, 1000, 0.5, 250, 20.0, 90.0) == pytest.approx(
      750 * 0.5 + 3 * 20.0 + 90.0)


def test_eta_does_not_jump_across_an_evaluation():
  """Just before and just after a validation the estimate differs by that
  validation and one step, as the time left does; it used to rise by the
  validation times the steps left."""
  before = actions.eta_seconds(249, 1000, 0.5, 250, 20.0, 90.0)
  after = actions.eta_seconds(251, 1000, 0.5, 250, 20.0, 90.0)
  assert before - after == pytest.approx(2 * 0.5 + 20.0)


def test_evaluations_not_yet_timed_count_nothing_and_no_eval_every_means_none():
  assert actions.eta_seconds(10, 100, 1.0, 50, None, None) == 90.0
  assert actions.eta_seconds(10, 100, 1.0, 0, 5.0, 0.0) == 90.0
  assert actions.eta_seconds(100, 100, 1.0, 50, 5.0, 7.0) == 7.0
