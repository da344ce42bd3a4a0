"""The training loop with periodic actions (`training/periodic.py`)."""

import dataclasses

import pytest

from attention_jax.training import periodic
from attention_jax.training.periodic import PeriodicAction


@dataclasses.dataclass(frozen=True)
class _State:
  step: int = 0
  seen: tuple = ()  # the batches trained on


def _advance(state, batch):
  return dataclasses.replace(state, step=state.step + 1, seen=state.seen + (batch,))


def _recorder(calls, name, stop_at=None):
  def fn(state):
    calls.append((state.step, name))
    return state, ("stopped" if state.step == stop_at else None)
  return fn


def test_actions_run_at_their_period_and_after_the_last_step_in_registration_order():
  calls = []
  actions = [PeriodicAction(3, _recorder(calls, "a")), PeriodicAction(2, _recorder(calls, "b"))]
  state, stop = periodic.train_loop(_State(), 7, _advance, iter(range(100)), actions)
  assert stop is None and state.step == 7 and state.seen == tuple(range(7))
  assert calls == [(2, "b"), (3, "a"), (4, "b"), (6, "a"), (6, "b"), (7, "a"), (7, "b")]


def test_a_resumed_loop_trains_only_the_remaining_steps():
  calls = []
  state, stop = periodic.train_loop(_State(step=5), 7, _advance, iter("xyz"),
                                    [PeriodicAction(2, _recorder(calls, "a"))])
  assert stop is None and state.step == 7 and state.seen == ("x", "y")
  assert calls == [(6, "a"), (7, "a")]
  calls.clear()
  state, _ = periodic.train_loop(_State(step=7), 7, _advance, iter("xyz"),
                                 [PeriodicAction(1, _recorder(calls, "a"))])
  assert state.step == 7 and not state.seen and not calls  # finished: nothing to do


def test_a_stop_ends_the_loop_at_once_with_the_state_its_action_returned():
  calls = []

  def mark(state):
    return dataclasses.replace(state, seen=state.seen + ("marked",)), (
        "stop" if state.step == 4 else None)

  actions = [PeriodicAction(2, mark), PeriodicAction(1, _recorder(calls, "after"))]
  state, stop = periodic.train_loop(_State(), 10, _advance, iter(range(100)), actions)
  assert stop == "stop" and state.step == 4
  assert state.seen == (0, 1, "marked", 2, 3, "marked")
  assert calls == [(1, "after"), (2, "after"), (3, "after")]  # not after the stop


def test_a_period_must_be_positive():
  with pytest.raises(ValueError, match="`every`.*got 0"):
    PeriodicAction(0, lambda state: (state, None))
