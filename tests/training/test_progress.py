"""The progress line's ETA and clock: steady steps with pauses clipped out,
the periodic actions and the final evaluation at their measured cost without
compilation, "not yet timed" before they ran once; the whole sweep's; the
first step's time, said at once. Every clock here is a fake one."""

import dataclasses
import math
import re
import types

import jax.monitoring
import numpy as np
import pytest

from attention_jax.sweep import config
from attention_jax.training import actions
from attention_jax.training import evaluation
from attention_jax.training import periodic
from attention_jax.training import progress
from attention_jax.training.run_config import Arm
from attention_jax.training.run_config import Member
from attention_jax.training.state import TrainState

COMPILED = "/jax/core/compile/backend_compile_duration"  # what JAX reports per program


# --- the pure estimators --------------------------------------------------------


def test_eta_counts_the_steps_and_every_action_still_due_at_its_cost():
  # The line at step 250 of 1,000 comes before that step's validation and
  # checkpoint (`actions` order): validations at 250, 500, 750, 1,000;
  # diagnostics at 300, ..., 1,000 (every 100, not at 250); the final test.
  eta = progress.run_eta_seconds(250, 1000, 0.5, [(100, 0.2), (250, 20.0), (250, 1.0)], 90.0)
  assert eta == pytest.approx(750 * 0.5 + 8 * 0.2 + 4 * 20.0 + 4 * 1.0 + 90.0)
  # The last step is always due; a period beyond it runs there only.
  assert progress.due_count(300, 1, 1000) == 4
  assert progress.due_count(5000, 1, 1000) == 1
  assert progress.due_count(250, 1001, 1000) == 0
  assert progress.run_eta_seconds(1000, 1000, None, [(250, 20.0)], 7.0) == 27.0


def test_eta_is_not_yet_timed_while_a_part_still_to_come_has_no_time():
  assert progress.run_eta_seconds(60, 120, 0.5, [(60, None)], 30.0) is None
  assert progress.run_eta_seconds(60, 120, 0.5, [(60, 2.0)], None) is None
  assert progress.run_eta_seconds(60, 120, None, [(60, 2.0)], 30.0) is None
  # Every action runs after the last step too: at 130 of 140, once each.
  assert progress.run_eta_seconds(130, 140, 0.5, [(200, 2.0), (20, 1.0)], 3.0) == 5 + 2 + 1 + 3


def test_a_pause_is_clipped_at_ten_times_the_median_step():
  times = progress.StepTimes()
  kept = [times.add(s) for s in (0.5, 0.6, 0.4, 0.5, 0.5, 600.0, 0.5, 3.0)]
  assert kept[5] == pytest.approx(10 * 0.5)  # a SIGSTOP of 10 minutes counts 5 s
  assert kept[7] == 3.0  # a slow step (6x) is kept
  assert times.paused == pytest.approx(595.0)
  assert times.mean == pytest.approx((0.5 + 0.6 + 0.4 + 0.5 + 0.5 + 5.0 + 0.5 + 3.0) / 8)
  # A lasting slow-down (the machine got busy) moves the median and is kept.
  for _ in range(progress.MEDIAN_WINDOW):
    times.add(8.0)
  assert times.add(8.0) == 8.0


def test_the_final_estimate_counts_each_new_program_once_and_the_decode_by_its_work():
  # 4 s of steady decode x 10 (5 batches at beam 4 over 2 greedy batches),
  # 1 s perplexity, 0.2 s diagnostics, 2 new programs at 6 s each.
  assert progress.final_estimate_seconds(4.0, 1.0, 10.0, 2, 6.0, 0.2) == pytest.approx(
      40 + 1 + 0.2 + 12)


def test_the_sweep_eta_adds_the_queued_runs_shared_between_workers():
  assert progress.sweep_eta_seconds([30.0], 2, 100.0) == 230.0
  # Two workers: 30 and 50 s left, three queued runs of 100 s: the first
  # free worker takes each (130, 150, then 230).
  assert progress.sweep_eta_seconds([30.0, 50.0], 3, 100.0, workers=2) == 230.0
  assert progress.sweep_eta_seconds([], 3, 100.0, workers=2) == 200.0
  assert progress.sweep_eta_seconds([None], 2, 100.0) is None
  assert progress.sweep_eta_seconds([30.0], 2, None) is None
  assert progress.sweep_eta_seconds([30.0], 0, None) == 30.0


def test_the_sweep_progress_times_finished_runs_without_their_pauses():
  clock = types.SimpleNamespace(now=1000.0)
  sweep = progress.SweepProgress(3, clock=lambda: clock.now)
  sweep.start_run()
  assert sweep.eta(None) is None  # the run is not yet timed: nor is the sweep
  clock.now += 40
  # No run finished: each queued run as long as this one's projection (40 + 60).
  assert sweep.eta(60.0) == pytest.approx(60 + 2 * 100)
  clock.now += 650
  sweep.add_pause(600.0)  # SIGSTOP for 10 minutes inside the first run
  sweep.end_run()
  clock.now += 10  # its reports
  sweep.start_run()  # the first run took 100 s of work, its reports included
  clock.now += 10
  # The second run's 50 s, its reports' 10 s, the third run's 100 s.
  assert sweep.eta(50.0) == pytest.approx(50 + 10 + 100)


def test_lines_say_durations_clock_times_in_utc_and_name_member_values():
  assert [progress.duration(s) for s in (26.4, 59.4, 150, 7200)] == [
      "26 s", "59 s", "2.5 min", "2.0 h"]
  assert progress.clock(0.0) == "00:00 UTC"
  assert progress.clock(13 * 3600 + 7 * 60 + 59) == "13:07 UTC"
  seeds = [Member(0), Member(1)]
  assert progress.by_member(seeds, ["2.883", "2.994"]) == "2.883 2.994"
  rates = [Member(s, (("learning_rate", lr),)) for lr in (1e-3, 3e-3) for s in (0, 1)]
  assert progress.by_member(rates, ["2.9", "3.0", "2.8", "2.7"]) == (
      "learning_rate=0.001: 2.9 3.0; learning_rate=0.003: 2.8 2.7")


def test_a_stopwatch_leaves_out_the_compilation_jax_reports():
  clock = types.SimpleNamespace(now=0.0)
  with progress.Stopwatch(lambda: clock.now) as watch:
    clock.now += 9.0
    # A decoder (traced, lowered, compiled: 7 s) and a helper of 10 ms.
    jax.monitoring.record_event_duration_secs("/jax/core/compile/jaxpr_trace_duration", 0.5)
    jax.monitoring.record_event_duration_secs(
        "/jax/core/compile/jaxpr_to_mlir_module_duration", 0.5)
    jax.monitoring.record_event_duration_secs(COMPILED, 6.0)
    jax.monitoring.record_event_duration_secs(COMPILED, 0.01)
  cost = watch.cost
  assert (cost.seconds, cost.programs) == (9.0, 2)
  assert cost.compile_seconds == pytest.approx(7.01)
  assert cost.largest_program == pytest.approx(7.0)
  assert cost.steady == pytest.approx(1.99)


# --- a whole run on a fake clock ---------------------------------------------------


class _Clock:
  """The fake time of a simulated run; `compile` is a program compiling, as
  JAX reports it."""

  def __init__(self):
    self.now = 1_000_000.0

  def __call__(self):
    return self.now

  def compile(self, seconds):
    self.now += seconds
    jax.monitoring.record_event_duration_secs(COMPILED, seconds)


class _Data:
  """Sentences and fixed-shape batches of each split (every batch one shape)."""
  sizes = {"validation": 128, "test": 320}

  def texts(self, split):
    n = self.sizes[split]
    return [f"s{i}" for i in range(n)], ["a b"] * n

  def batches(self, split, batch_size, shuffle=False, repeat=False, limit=None, **_):
    n = min(limit or self.sizes[split], self.sizes[split])
    for start in range(0, n, batch_size):
      index = np.arange(start, start + batch_size)
      yield types.SimpleNamespace(src=np.full((batch_size, 8), 5, np.int32),
                                  tgt=np.full((batch_size, 8), 5, np.int32),
                                  index=np.where(index < n, index, -1))


def _evaluator(rc, clock, seen):
  """A real `Evaluator` whose compiled programs are fakes that take time on
  `clock`: a decoder compiles once per (beam, attention, shape) (greedy 8 s,
  beam 6 s, the heat map's 7 s) and takes 1 s per batch and beam; the
  perplexity program compiles in 4 s and takes 0.5 s per batch."""
  ev = object.__new__(evaluation.Evaluator)
  ev.run, ev.settings, ev.label = rc, rc.evaluation, rc.arm.label
  ev.data, ev.members, ev.rest = _Data(), 2, None
  ev.tok = types.SimpleNamespace(pad_id=0, sos_id=1, eos_id=2, decode=lambda ids: "a b")
  ev.val_beam_size = rc.evaluation.validation_beam
  ev.placement = types.SimpleNamespace(sharded=True, put=lambda *a: a,
                                       replicated=lambda x: x,
                                       layout=lambda: {"devices": 1, "members": 1, "data": 1})
  ev._decoders, ev._batch_sizes = {}, {}
  # What the estimate reads (as `Evaluator.__init__` sets it).
  ev.validation_costs, ev._decoded, ev._translated_batches, ev._test_batches = [], set(), 0, None

  def decoder(beam, return_attention=False):
    def decode(params, rest, src):
      key = (beam, return_attention, src.shape)
      if key not in seen:
        seen.add(key)
        clock.compile(7.0 if return_attention else 8.0 if beam == 1 else 6.0)
      clock.now += 0.1 if return_attention else 1.0 * beam
      tokens = np.full((2, src.shape[0], 4), 5, np.int32)
      return (tokens, np.zeros((2, src.shape[0], 4, 8))) if return_attention else tokens
    return decode

  def eval_step(params, rest, src, tgt_in, tgt_out):
    if "perplexity" not in seen:
      seen.add("perplexity")
      clock.compile(4.0)
    clock.now += 0.5
    return np.full(2, 10.0), np.full(2, 5.0)

  ev._decoder, ev._eval_step = decoder, eval_step
  return ev


def _simulated_run(monkeypatch, pause_at=None, sweep_runs=None):
  """A run of 400 steps on a fake clock (steps of 0.4-0.6 s, the first
  compiling for 30 s; diagnostics every 40 steps, 3 s compiling then 0.2 s;
  validation every 100; checkpoints every 100 at 1 s; progress every 20),
  SIGSTOPped for 15 minutes inside step `pause_at`. Returns each progress
  line with its time, the time the run ended and its state; with
  `sweep_runs`, as the first run of a sweep of that many."""
  clock = _Clock()
  monkeypatch.setattr(actions.time, "time", clock)
  start = clock.now
  sweep = None
  if sweep_runs:
    sweep = progress.SweepProgress(sweep_runs, clock=clock)
    sweep.start_run()
  cfg = config.from_preset(
      "smoke", arms=("additive",), dims=(8,), steps=400, log_every=20, diag_every=40,
      eval_every=100, checkpoint_every=100, eval_examples=128, test_examples=320,
      eval_batch_size=64, beam_size=4, val_beam_size=1, seeds=2)
  rc = cfg.point(Arm.of("additive", 8))
  seen = set()
  lines = []

  def log(line):
    lines.append((clock.now, line))

  def step(state, batch):
    if state.step == 0:
      clock.compile(30.0)
    clock.now += 0.5 + 0.1 * math.sin(state.step)
    if state.step + 1 == pause_at:
      clock.now += 900.0
    return state.replace(step=state.step + 1, loss=np.array([2.0, 2.5]))

  def diagnose(params, batch):
    if "diag" not in seen:
      seen.add("diag")
      clock.compile(3.0)
    clock.now += 0.2
    return {"logit_std": np.ones(2)}

  def save(step, arrays, meta):
    clock.now += 1.0

  zeros = lambda: {"w": np.zeros((2, 1), np.float32)}
  state = TrainState(params=zeros(), opt_state=None, best_params=zeros(),
                     best_bleu=np.full(2, -1.0), best_step=np.zeros(2, np.int64),
                     diverged_at=np.zeros(2, np.int64), loss=np.zeros(2),
                     best_ppl=np.full(2, np.inf))
  trainer = types.SimpleNamespace(
      run_config=rc, label="additive d=8", data=_Data(), seeds=(0, 1),
      members=rc.members(), num_params=10, state=state,
      evaluator=_evaluator(rc, clock, seen), diverged_loss=1e9, step=step,
      diagnose=diagnose, mark_diverged=lambda state, bad, why, log: state,
      check_params=lambda state, log: state, tok=types.SimpleNamespace(pad_id=0))
  trainer.placement = trainer.evaluator.placement
  board = types.SimpleNamespace(scalars=lambda *a: None, flush=lambda: None, row=lambda r: None)
  run = actions.RunActions(trainer, types.SimpleNamespace(save=save),
                           types.SimpleNamespace(append=lambda row: None), board, log, None,
                           sweep)
  batches = iter(lambda: types.SimpleNamespace(src=np.ones((4, 8), np.int32),
                                               tgt=np.ones((4, 8), np.int32)), None)
  state, stop = periodic.train_loop(state, 400, run.advance, batches, run.actions())
  state, result = run.finish(state, stop)
  assert result is not None
  return ([(t - start, line) for t, line in lines if " loss " in line], clock.now - start,
          state)


def _eta(line, which="ETA"):
  """The run's ETA a progress line gives (`which="sweep"`: the sweep's), in
  seconds; None: not yet timed."""
  found = re.search(which + r" (not yet timed|[\d.]+ (s|min|h))", line)
  assert found, line
  if found.group(1) == "not yet timed":
    return None
  number, unit = found.group(1).split()
  return float(number) * {"s": 1, "min": 60, "h": 3600}[unit]


@pytest.mark.parametrize("pause_at", [None, 150, 330])
def test_the_eta_is_within_a_quarter_of_the_time_left_after_the_first_validation(
    monkeypatch, pause_at):
  progress_lines, end, state = _simulated_run(monkeypatch, pause_at)
  assert len(progress_lines) == 20
  for t, line in progress_lines:
    step = int(re.search(r"step (\d+)/", line).group(1))
    eta = _eta(line)
    if step <= 100:  # the line at step 100 comes before its validation
      assert eta is None and "ETA not yet timed" in line, line
    else:
      truth = end - t - (900.0 if pause_at and step < pause_at else 0.0)
      assert 0.75 * truth <= eta <= 1.25 * truth, (line, truth)
  # The pause is not training time either: at most 10 median steps of it count.
  trained = 30.0 + sum(0.5 + 0.1 * math.sin(s) for s in range(400))
  assert trained - 1e-6 <= state.train_seconds <= trained + (5.0 if pause_at else 0.0) + 1e-6


def test_progress_lines_carry_the_clock_and_the_sweep_eta(monkeypatch):
  # The first run of three, on a fake clock that starts at 13:46:40 UTC (its
  # first line 40 s later: 13:47); no run finished, so each queued run is
  # taken as long as this one's projection.
  lines, end, _ = _simulated_run(monkeypatch, sweep_runs=3)
  for t, line in lines:
    assert re.search(r"\| \d\d:\d\d UTC$", line), line
    if _eta(line) is None:
      assert "ETA not yet timed, sweep not yet timed |" in line
    else:
      assert 0.75 * (3 * end - t) <= _eta(line, "sweep") <= 1.25 * (3 * end - t), line
  assert lines[0][1].endswith("| 13:47 UTC")


# --- the first steps of a call --------------------------------------------------


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
                                      seeds=(0, 1), members=(Member(0), Member(1)))
  run.label, run.log, run.sweep = "dot d=16", lines.append, None
  run.timed_steps, run.shapes_seen = 0, set()
  run.step_times, run.cycle_times = progress.StepTimes(), progress.StepTimes()
  run._cycle_end, run._in_actions = None, 0.0
  run.action_costs = {"diagnose": [], "validate": [], "checkpoint": []}
  run.window_seconds, run.window_tokens = 0.0, 0
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
  assert run.step_times.count == 4 and run.step_times.mean == pytest.approx(0.5)
  # The progress line: 994 steps left at 0.5 s, but no evaluation timed yet.
  run.board = types.SimpleNamespace(scalars=lambda *args: None)
  run.trainer.members, run.learning_rates = [], []
  run.evaluator = types.SimpleNamespace(final_estimate=lambda other: None)
  run.last_step = 1000
  run.run = types.SimpleNamespace(periods=types.SimpleNamespace(
      diag_every=1000, eval_every=1000, checkpoint_every=1000))
  run.log_progress(state.replace(loss=np.array([2.0, 2.5])))
  assert lines[-1].startswith("[dot d=16] step 6/1000 loss 2.000 2.500 | ")
  assert lines[-1].endswith("| ETA not yet timed | 00:03 UTC")  # 182 s on the clock


def test_a_member_runs_progress_line_says_which_rate_each_loss_is_of(monkeypatch):
  lines = []
  run, clock = _advancing(lines)
  monkeypatch.setattr(actions.time, "time", lambda: clock.now)
  run.trainer.members = [Member(s, (("learning_rate", lr),)) for lr in (1e-3, 3e-3)
                         for s in (0, 1)]
  run.learning_rates = [lambda step: 0.0] * 4
  run.board = types.SimpleNamespace(scalars=lambda *args: None)
  run.evaluator = types.SimpleNamespace(final_estimate=lambda other: None)
  run.last_step = 100
  run.run = types.SimpleNamespace(periods=types.SimpleNamespace(
      diag_every=100, eval_every=100, checkpoint_every=100))
  run.log_progress(_State(step=20, loss=np.array([2.0, 2.5, 2.1, 2.6])))
  # It was "loss 2.000 2.500 2.100 2.600": four numbers, no rate named.
  assert lines[-1].startswith("[dot d=16] step 20/100 loss learning_rate=0.001: 2.000 "
                              "2.500; learning_rate=0.003: 2.100 2.600 | ")
