"""The progress line's ETA: steady-state steps and the evaluations to come; the
first step's time, said at once."""

import dataclasses
import types

import numpy as np
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


def _advancing(lines):
  """An `actions.RunActions` with only what `advance` and `log_progress` read,
  whose trainer's step takes the seconds `seconds[step]` (a fake clock)."""
  run = object.__new__(actions.RunActions)
  clock = types.SimpleNamespace(now=0.0, seconds={})

  def step(state, batch):
    del batch
    clock.now += clock.seconds.get(state.step + 1, 0.5)
    return state.replace(step=state.step + 1)

  run.trainer = types.SimpleNamespace(step=step, tok=types.SimpleNamespace(pad_id=0),
                                      seeds=(0, 1))
  run.label, run.log = "dot d=16", lines.append
  run.timed_steps, run.steady_steps, run.steady_seconds = 0, 0, 0.0
  run.shapes_seen, run.window_seconds, run.window_tokens = set(), 0.0, 0
  return run, clock


@dataclasses.dataclass(frozen=True)
class _State:
  step: int
  train_seconds: float = 0.0
  loss: object = None

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


def _batch(length):
  return types.SimpleNamespace(src=np.ones((2, length), np.int32),
                               tgt=np.array([[5, 6] + [0] * (length - 2), [7] + [0] * (length - 1)]))


def test_the_first_step_of_a_call_says_its_time_with_compilation_and_only_it(monkeypatch):
  lines = []
  run, clock = _advancing(lines)
  monkeypatch.setattr(actions.time, "time", lambda: clock.now)
  state = _State(step=41)  # a resumed run: the first step of this call is 42
  for _ in range(3):
    state = run.advance(state, _batch(3))
  assert state.step == 44 and run.timed_steps == 3 and run.window_tokens == 3 * 3 * 2
  assert lines == ["[dot d=16] step 42: 0.5 s with compilation"]


def test_each_new_batch_shape_compiles_and_stays_out_of_the_steady_step_time(monkeypatch):
  # Steps 1 and 3 meet a batch shape for the first time and take 90 s (XLA
  # compiling, as on the H200); the steady step takes 0.5 s.
  lines = []
  run, clock = _advancing(lines)
  clock.seconds = {1: 90.0, 3: 90.0}
  monkeypatch.setattr(actions.time, "time", lambda: clock.now)
  state = _State(step=0)
  for length in (8, 8, 16, 8, 16, 16):
    state = run.advance(state, _batch(length))
  assert lines == ["[dot d=16] step 1: 90.0 s with compilation",
                   "[dot d=16] step 3: 90.0 s with compilation (a new batch shape: sources "
                   "of 16, targets of 16 tokens)"]
  assert run.steady_steps == 4 and run.steady_seconds == pytest.approx(4 * 0.5)
  # The progress line's ETA: 994 steps left at 0.5 s (no evaluation here).
  run.board = types.SimpleNamespace(scalars=lambda *args: None)
  run.trainer.members, run.learning_rates, run.last_validation = [], [], None
  run.last_step, run.run = 1000, types.SimpleNamespace(periods=types.SimpleNamespace(eval_every=0))
  run.log_progress(state.replace(loss=np.array([2.0, 2.5])))
  assert lines[-1].startswith("[dot d=16] step 6/1000 loss 2.000 2.500 | ")
  assert f"ETA {994 * 0.5 / 60:.1f} min, evaluation not yet timed" in lines[-1]
