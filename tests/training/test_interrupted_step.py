"""Where SIGTERM or Ctrl-C stops a run: after the step under way and the
actions due at that step (docs/reliability.md), not at the next validation
or checkpoint. The real actions' order (`RunActions.actions`) and stop
(`RunActions.stop_if_interrupted`) in the real loop (`periodic.train_loop`),
the other actions recorded instead of run."""

import dataclasses
import signal
import types

import pytest

from attention_jax.training import actions as actions_lib
from attention_jax.training import interrupts
from attention_jax.training import periodic


@dataclasses.dataclass(frozen=True)
class _State:
  step: int = 0


def _run(monkeypatch, signal_during: int, steps: int = 200):
  """Trains `steps` fake steps with the smoke preset's periods; SIGINT
  arrives during step `signal_during`. Returns (steps trained, what ran)."""
  monkeypatch.setitem(interrupts._received, "signum", None)  # restored after the test
  monkeypatch.setitem(interrupts._received, "event", None)
  monkeypatch.setitem(interrupts._received, "unsaved", None)  # past the first step: a request
  calls, trained = [], []
  run = actions_lib.RunActions.__new__(actions_lib.RunActions)
  run.run = types.SimpleNamespace(periods=types.SimpleNamespace(
      log_every=20, diag_every=20, eval_every=60, checkpoint_every=40))
  run.label, run.saved_at, run.deadline, run._in_actions = "toy", None, None, 0.0
  run.action_costs = {"diagnose": [], "validate": [], "checkpoint": []}
  run.log = lambda line: calls.append(("log", line))

  def recorder(name):
    def fn(state):
      calls.append((name, state.step))
      if name == "checkpoint":
        run.saved_at = state.step
      return state, None
    return fn

  for name in ("check_loss", "log_progress", "diagnose", "validate", "checkpoint",
               "stop_at_deadline"):
    setattr(run, name, recorder(name))

  def advance(state, batch):
    del batch
    if state.step + 1 == signal_during:  # the signal's handler runs as the step computes
      interrupts._handle(signal.SIGINT, None)
    trained.append(state.step + 1)
    return _State(state.step + 1)

  with pytest.raises(interrupts.Interrupted) as e:
    periodic.train_loop(_State(), steps, advance, iter(range(steps)), run.actions())
  assert e.value.signum == signal.SIGINT
  return trained, calls


def test_a_signal_during_a_plain_step_stops_after_it_without_a_validation(monkeypatch):
  trained, calls = _run(monkeypatch, signal_during=45)
  assert trained[-1] == 45  # not 60, the next validation
  assert [c for c in calls if c[0] == "validate"] == []
  assert [c[1] for c in calls if c[0] == "checkpoint"] == [40, 45]  # its own checkpoint
  assert calls[-1] == ("log", "[toy] SIGINT: checkpoint saved at step 45; re-run the same "
                              "command to resume")


def test_a_signal_during_a_validation_step_stops_after_its_actions(monkeypatch):
  # Step 60's validation is part of the step: it runs, then the stop, with
  # the checkpoint of step 60; a resume at 60 repeats nothing and skips nothing.
  trained, calls = _run(monkeypatch, signal_during=60)
  assert trained[-1] == 60
  assert [c[1] for c in calls if c[0] == "validate"] == [60]
  assert [c[1] for c in calls if c[0] == "checkpoint"] == [40, 60]
  assert calls[-1][1].startswith("[toy] SIGINT: checkpoint saved at step 60;")
