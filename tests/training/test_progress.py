"""The progress line's ETA: steady-state steps and the evaluations to come; the
first step's time, said at once."""

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


def test_the_first_step_of_a_call_says_its_time_with_compilation_and_only_it():
  import dataclasses
  import types
  import numpy as np

  @dataclasses.dataclass(frozen=True)
  class State:
    step: int
    train_seconds: float = 0.0

    def replace(self, **changes):
      return dataclasses.replace(self, **changes)

  lines = []
  run = object.__new__(actions.RunActions)  # only what `advance` reads
  run.trainer = types.SimpleNamespace(step=lambda s, b: s.replace(step=s.step + 1),
                                      tok=types.SimpleNamespace(pad_id=0), seeds=(0, 1))
  run.label, run.log = "dot d=16", lines.append
  run.timed_steps, run.steady_seconds, run.window_seconds, run.window_tokens = 0, 0.0, 0.0, 0
  batch = types.SimpleNamespace(tgt=np.array([[5, 6, 0], [7, 0, 0]]))
  state = State(step=41)  # a resumed run: the first step of this call is 42
  for _ in range(3):
    state = run.advance(state, batch)
  assert state.step == 44 and run.timed_steps == 3 and run.window_tokens == 3 * 3 * 2
  assert len(lines) == 1 and lines[0].startswith("[dot d=16] step 42: ")
  assert lines[0].endswith(" s with compilation")
