"""The periodic actions of one `EnsembleTrainer.run`, and its final evaluation.

After every step, in this order (each also after the last step):

  every step          a member whose loss exploded is marked diverged; all
                      diverged: training ends and goes to the final evaluation
  `log_every`         a progress line (losses, target tokens/s, ETA, clock;
                      `progress` estimates the time left)
  `diag_every`        softmax diagnostics of a fixed validation batch
  `eval_every`        validation BLEU and perplexity; each member keeps its best
                      (higher BLEU; at equal BLEU, lower perplexity)
  `checkpoint_every`  a checkpoint, then the deadline: past it, training pauses
  every step          SIGTERM or Ctrl-C: a checkpoint (if this step has none), stop
"""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.training import interrupts
from attention_jax.training import multihost
from attention_jax.training import progress
from attention_jax.training.evaluation import Evaluator
from attention_jax.training.metrics_log import rounded
from attention_jax.training.periodic import PeriodicAction
from attention_jax.training.placement import Placement
from attention_jax.training.run_config import Member
from attention_jax.training.run_config import RunConfig
from attention_jax.training.state import TrainState

# Why an action ended the loop early.
ALL_DIVERGED = "all diverged"  # goes on to the final evaluation
PAUSED = "paused"  # the deadline: the checkpoint is saved, a re-run resumes


@dataclasses.dataclass
class GroupResult:
  """What one finished (arm, dim) configuration produced, per seed."""
  rows: list[dict[str, Any]]
  attention: dict[str, Any] | None  # one test sentence's alignment (seed 0), for plots
  # The final test translations: {"references": [N], "hypotheses": [E][N]}
  # (detokenised), kept for significance tests between runs.
  translations: dict[str, Any] | None = None


def improved(scores: np.ndarray, ppl: np.ndarray, best_bleu: np.ndarray,
             best_ppl: np.ndarray) -> np.ndarray:
  """`[E]` bool: the members whose validation beats their best so far.

  Higher BLEU wins; equal BLEU and strictly lower perplexity wins too. Why
  the tie-break: validation BLEU ties often (every early checkpoint of a
  collapsed arm scores 0), and keeping the first of tied checkpoints compared
  two arms at different steps; the lower perplexity is the better model at
  equal BLEU. A NaN anywhere (a diverged member's score, a best perplexity
  not known, `TrainState.restored`) compares false: never better.
  """
  return (scores > best_bleu) | ((scores == best_bleu) & (ppl < best_ppl))


@jax.jit  # compiled, so that with several processes the result is one global array
def keep_better(better, new, old):
  """Members flagged in `better [E]` take `new`, the others keep `old`."""
  return jax.tree.map(
      lambda n, o: jnp.where(better.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, old)


class Trainer(Protocol):
  """What the actions use of the trainer (`train_lib.EnsembleTrainer`): its
  run, members and data, and the steps it compiled. Named here, so that this
  module needs nothing of the trainer's."""
  run_config: RunConfig
  label: str
  data: Any  # the dataset (`input_pipeline.load`)
  tok: Any  # its tokenizer
  seeds: tuple[int, ...]  # [E]: each member's seed
  members: tuple[Member, ...]  # [E]: each member's seed and member values
  num_params: int
  state: TrainState
  evaluator: Evaluator
  placement: Placement
  diverged_loss: float

  def step(self, state: TrainState, batch) -> TrainState: ...

  def diagnose(self, params, batch) -> dict[str, np.ndarray]: ...

  def mark_diverged(self, state: TrainState, bad, why: str,
                    log: Callable[[str], None] = print) -> TrainState: ...

  def check_params(self, state: TrainState, log: Callable[[str], None]) -> TrainState: ...


class RunActions:
  """The actions of one `run` call and what they share: its checkpointer,
  metrics log, TensorBoard writer, log, deadline and timers."""

  def __init__(self, trainer: Trainer, ckpt, metrics, board,
               log: Callable[[str], None], deadline: float | None,
               sweep: progress.SweepProgress | None = None):
    self.trainer, self.evaluator = trainer, trainer.evaluator
    self.ckpt, self.metrics, self.board, self.log = ckpt, metrics, board, log
    self.deadline, self.sweep = deadline, sweep
    self.label = trainer.label
    self.run = trainer.run_config
    self.last_step = self.run.optimizer.steps
    # Each member's schedule: its own peak where the learning rate is a member field.
    self.learning_rates = [
        dataclasses.replace(self.run.optimizer, **dict(m.values)).learning_rate_schedule()
        for m in trainer.members]
    self.diag_batch = next(trainer.data.batches("validation", self.run.data.batch_size,
                                                shuffle=False, repeat=False))
    self.start_step = trainer.state.step
    # Seconds, of this call (the first one compiles the decoder): the
    # deadline's cautious bound on the final evaluation starts from it.
    self.slowest_validation = 0.0
    # Steps of this call, and the times of those that compiled nothing: the
    # step compiles for each new batch shape (one per length bucket), on an
    # H200 91-116 s each where a step then takes 27 ms
    # (results/gpu_h200/2026-11-28b): such a step in the steady time made the
    # ETA hours too long. `step_times`: the step itself (`train_seconds`);
    # `cycle_times`: from one step's end to the next's, less the timed
    # actions between them, so that loading a batch and the cheap actions
    # count in the ETA too. Both with pauses clipped (`progress.StepTimes`).
    self.timed_steps = 0
    self.step_times, self.cycle_times = progress.StepTimes(), progress.StepTimes()
    self._cycle_end, self._in_actions = None, 0.0
    # The seconds of each call of a timed action, its compilation left out.
    self.action_costs = {"diagnose": [], "validate": [], "checkpoint": []}
    self.shapes_seen = set()  # the batch shapes this call's steps were compiled for
    self.saved_at = None  # the step of this call's latest checkpoint
    self._restart_window()

  def actions(self) -> list[PeriodicAction]:
    p = self.run.periods
    return [PeriodicAction(1, self.check_loss),
            PeriodicAction(p.log_every, self.log_progress),
            PeriodicAction(p.diag_every, self._timed("diagnose", self.diagnose)),
            PeriodicAction(p.eval_every, self._timed("validate", self.validate)),
            PeriodicAction(p.checkpoint_every, self._timed("checkpoint", self.checkpoint)),
            PeriodicAction(p.checkpoint_every, self.stop_at_deadline),
            PeriodicAction(1, self.stop_if_interrupted)]

  def _timed(self, name: str, action):
    """`action`, its cost kept in `action_costs[name]` for the ETA and its
    wall time kept out of the step time."""
    def timed(state):
      with progress.Stopwatch() as watch:
        out = action(state)
      self.action_costs[name].append(watch.cost.steady)
      self._in_actions += watch.cost.seconds
      return out
    return timed

  def _restart_window(self) -> None:
    self.window_tokens, self.window_seconds, self.window_start = 0, 0.0, time.time()

  def advance(self, state: TrainState, batch) -> TrainState:
    """One training step, timed; its target tokens count towards tokens/s.
    The first step at each batch shape compiles: its time is said at once (a
    run's start was silent for minutes) and kept out of the steady-state step
    time."""
    shape = (np.shape(batch.src), np.shape(batch.tgt))
    compiles = shape not in self.shapes_seen
    self.shapes_seen.add(shape)
    start = time.time()
    state = self.trainer.step(state, batch)
    end = time.time()
    interrupts.something_to_save()  # a stop now waits for the step and saves it
    seconds = end - start
    self.timed_steps += 1
    if compiles:
      why = ("" if len(self.shapes_seen) == 1 else
             f" (a new batch shape: sources of {shape[0][-1]}, targets of {shape[1][-1]} tokens)")
      self.log(f"[{self.label}] step {state.step}: {seconds:.1f} s with compilation{why}")
    else:
      # A pause (SIGSTOP) is clipped out of both: the step's own time, and the
      # cycle's, which also sees one between two steps.
      seconds = self.step_times.add(seconds)
      if self._cycle_end is not None:
        before = self.cycle_times.paused
        self.cycle_times.add(end - self._cycle_end - self._in_actions)
        if self.sweep is not None:
          self.sweep.add_pause(self.cycle_times.paused - before)
    self._cycle_end, self._in_actions = end, 0.0
    self.window_seconds += seconds
    self.window_tokens += (int((batch.tgt != self.trainer.tok.pad_id).sum())
                           * len(self.trainer.seeds))
    return state.replace(train_seconds=state.train_seconds + seconds)

  # --- the actions, in their order -------------------------------------------

  def check_loss(self, state: TrainState):
    state = self.trainer.mark_diverged(  # NaN is caught too
        state, ~(np.abs(state.loss) <= self.trainer.diverged_loss),
        f"loss {state.loss.tolist()}", self.log)
    if state.diverged_at.all():
      self.log(f"[{self.label}] every member diverged: training stops")
      return state, ALL_DIVERGED
    return state, None

  def eta(self, step: int) -> float | None:
    """This run's seconds left after its progress line at `step`
    (`progress.run_eta_seconds`); None until every part still to come was
    timed once."""
    cost = lambda name: progress.median_or_none(self.action_costs[name])
    step_seconds = self.cycle_times.mean
    if step_seconds is None:
      step_seconds = self.step_times.mean
    p = self.run.periods
    return progress.run_eta_seconds(
        step, self.last_step, step_seconds,
        [(p.diag_every, cost("diagnose")), (p.eval_every, cost("validate")),
         (p.checkpoint_every, cost("checkpoint"))],
        self.evaluator.final_estimate(cost("diagnose") or 0.0))

  def log_progress(self, state: TrainState):
    # tokens/s over training steps only; the ETA of the run (`eta`) and, in
    # a sweep, of the sweep; the clock, so that a log read later says when.
    step = state.step
    rate = self.window_tokens / max(self.window_seconds, 1e-9)
    for member, learning_rate in zip(self.trainer.members, self.learning_rates):
      self.board.scalars(member.keys, step, {"learning_rate": float(learning_rate(step)),
                                             "tokens_per_second": rate})
    left = self.eta(step)
    untimed = "not yet timed"
    eta = f"ETA {untimed if left is None else progress.duration(left)}"
    if self.sweep is not None:
      sweep_left = self.sweep.eta(left)
      eta += f", sweep {untimed if sweep_left is None else progress.duration(sweep_left)}"
    losses = progress.by_member(self.trainer.members, [f"{x:.3f}" for x in state.loss])
    self.log(f"[{self.label}] step {step}/{self.last_step} loss {losses} | "
             f"{rate:,.0f} target tok/s | {eta} | {progress.clock(time.time())}")
    self._restart_window()
    return state, None

  def diagnose(self, state: TrainState):
    stats = self.trainer.diagnose(state.params, self.diag_batch)
    for e, member in enumerate(self.trainer.members):
      self.metrics.append({"step": state.step, **member.keys, "loss": float(state.loss[e]),
                           **{k: rounded(v[e]) for k, v in stats.items()}})
    return state, None

  def validate(self, state: TrainState):
    """Validation BLEU and perplexity; a member whose validation improved
    (`improved`: higher BLEU, or equal BLEU and lower perplexity) keeps these
    parameters as its best."""
    start = time.time()
    state = self.trainer.check_params(state, self.log)  # the loss predates this step's update
    scores, ppl = self.evaluator.validate(state.params, state.diverged_at == 0)
    better = improved(scores, ppl, state.best_bleu, state.best_ppl)
    state = state.replace(
        best_bleu=np.where(better, scores, state.best_bleu),
        best_ppl=np.where(better, ppl, state.best_ppl),
        best_step=np.where(better, state.step, state.best_step),
        best_params=keep_better(self.trainer.placement.replicated(better), state.params,
                                state.best_params))
    for e, member in enumerate(self.trainer.members):
      self.metrics.append({"step": state.step, **member.keys,
                           "val_bleu": None if np.isnan(scores[e]) else float(scores[e]),
                           "val_ppl": rounded(ppl[e])})
    members = self.trainer.members
    self.log(f"[{self.label}] step {state.step}: validation BLEU "
             f"{progress.by_member(members, [f'{s:.2f}' for s in scores])}, perplexity "
             f"{progress.by_member(members, [f'{p:.2f}' for p in ppl])}")
    self.slowest_validation = max(self.slowest_validation, time.time() - start)
    return state, None

  def checkpoint(self, state: TrainState):
    """The checkpoint of this step: arrays and the bookkeeping a resume needs."""
    self.board.flush()  # on disk before the checkpoint: a resume purges only what follows
    # The layout too: a resume on another one says so (`placement.layout_change`).
    self.ckpt.save(state.step, state.arrays(),
                   {**state.meta(), "layout": self.trainer.placement.layout()})
    self.saved_at = state.step
    return state, None

  def stop_at_deadline(self, state: TrainState):
    if (self.deadline is not None and state.step < self.last_step
        and multihost.agree(time.time() > self.deadline)):
      self.log(f"[{self.label}] time budget reached at step {state.step}; "
               "checkpoint saved, re-run the same command to resume")
      return state, PAUSED
    return state, None

  def stop_if_interrupted(self, state: TrainState):
    # SIGTERM or Ctrl-C (`interrupts`): the steps so far are kept, and
    # every process stops at the same step.
    if multihost.anywhere(interrupts.requested() is not None):
      if self.saved_at != state.step:
        self.checkpoint(state)
      signum = interrupts.requested() or signal.SIGTERM
      self.log(f"[{self.label}] {signal.Signals(signum).name}: checkpoint saved at step "
               f"{state.step}; re-run the same command to resume")
      raise interrupts.Interrupted(signum)
    return state, None

  # --- after the loop ----------------------------------------------------------

  def finish(self, state: TrainState, stop) -> tuple[TrainState, GroupResult | None]:
    """The final evaluation after the loop ended with `stop`: the best
    parameters' test BLEU, a row per member and the alignment heat map;
    None instead where the deadline paused training or would pass during it."""
    if stop == PAUSED:
      return state, None
    if self.deadline is not None and state.step == self.last_step > self.start_step:
      # The last checkpoint is saved: a piece that would pass its deadline in
      # the final test decode stops here, and the next one only evaluates.
      estimate = self.evaluator.final_seconds(self.slowest_validation)
      if multihost.agree(time.time() + estimate > self.deadline):
        self.log(f"[{self.label}] trained to step {state.step}; the final evaluation "
                 f"(estimated {estimate:.0f} s) would pass the time budget: checkpoint "
                 "saved, re-run the same command to evaluate")
        return state, None
    state = self.trainer.check_params(state, self.log)
    ok = state.diverged_at == 0
    start = time.time()
    final = self.evaluator.final_estimate(
        progress.median_or_none(self.action_costs["diagnose"]) or 0.0)
    estimate = f", about {progress.duration(final)}" if final is not None else ""
    self.log(f"[{self.label}] final evaluation: test BLEU of the best parameters "
             f"(beam {self.run.evaluation.beam_size}){estimate}")
    test = self.evaluator.final_test(state.best_params, ok)
    final = self.trainer.diagnose(state.params, self.diag_batch)
    rows = [self._row(state, e, ok[e], test, final) for e in range(len(ok))]
    for e, member in enumerate(self.trainer.members):
      self.board.row({"step": state.step, **member.keys, "test_bleu": test.bleu[e]})
    attention = self.evaluator.alignment(state.best_params, "test")
    bleu = ['–' if b is None else f'{b:.2f}' for b in test.bleu]
    self.log(f"[{self.label}] test BLEU {progress.by_member(self.trainer.members, bleu)} "
             f"({time.time() - start:.0f} s)")
    if self.sweep is not None:
      self.sweep.end_run()
    return state, GroupResult(rows=rows, attention=attention, translations={
        "references": test.references, "hypotheses": test.hypotheses})

  def _row(self, state: TrainState, e: int, ok: bool, test, final) -> dict[str, Any]:
    """The result row of member `e`: its seed, and its member values (a
    `--sweep` grid's rows carry the swept values)."""
    arm = self.run.arm
    return {
        "arm": arm.name, "dim": arm.attention_dim, **self.trainer.members[e].keys,
        "model": self.run.family, "dataset": self.run.data.dataset,
        "params": self.trainer.num_params, "steps": state.step,
        "train_seconds": round(state.train_seconds, 2),
        "val_bleu": round(float(state.best_bleu[e]), 4) if ok else None,
        "best_step": int(state.best_step[e]),
        "test_bleu": round(float(test.bleu[e]), 4) if ok else None,
        "val_ppl": rounded(test.val_ppl[e]),
        "diverged_at_step": int(state.diverged_at[e]) or None,
        "diagnostics": {k: rounded(v[e]) for k, v in final.items()},
    }
