"""Training of one (arm, dim) configuration for several seeds.

The seeds of a configuration form an *ensemble axis* E: their parameters and
optimiser states are stacked and every step is one jit-compiled program over
them (`placement.over_members`: vmapped on accelerators, the members in turn on
CPU), so N seeds cost one compilation and one dispatch per step. All
members see the same batches; they differ in initialisation and dropout. With
member fields (`RunConfig.member_axes`, the `--members` flag) each seed is a
member at every value of them (`run_config.members`), e.g. 2 seeds x 3
learning rates = 6 members: a member's learning rate is data in its optimiser
state (`OptimizerConfig.make`), and a member trains as the separate run of
its seed at its values would.

What training carries from step to step is one pytree, `state.TrainState`; the
trainer builds the compiled programs, and `run` drives the state through
`periodic.train_loop` with the actions of `actions.RunActions` (progress
lines, diagnostics, validation, checkpoints, the deadline), then evaluates
(`evaluation.Evaluator`).

Shape glossary: E ensemble members (seeds), B batch, S source length,
T target length, V vocabulary.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Callable, Iterator

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from attention_jax import models
from attention_jax import registry
from attention_jax.training import actions as actions_lib
from attention_jax.training import checkpoints
from attention_jax.training import diagnostics
from attention_jax.training import evaluation
from attention_jax.training import multihost
from attention_jax.training import periodic
from attention_jax.training import placement as placement_lib
from attention_jax.training import progress
from attention_jax.training import run_config as run_config_lib
from attention_jax.training import steps
from attention_jax.training.metrics_log import Board
from attention_jax.training.metrics_log import MetricsLog
from attention_jax.training.placement import Placement
from attention_jax.training.run_config import RunConfig
from attention_jax.training.run_folder import RunDir
from attention_jax.training.state import TrainState
from attention_jax.training.state import with_logged_best_ppl


# A member counts as diverged once its training loss exceeds this many times
# ln(vocabulary size), the loss of the uniform prediction every model starts
# near and only goes below (lr 1e4 drove the smoke model's loss to ~1.3e5,
# a probe of absurd learning rates), or once its loss or any of its parameters is not finite.
DIVERGED_LOSS_FACTOR = 10.0


class OutOfMemory(ValueError):
  """A training step that ran out of memory, in one line naming the flags
  that size it (a ValueError: the drivers print it as their `error:` line,
  a `--workers` run as its reason)."""


class EnsembleTrainer:
  """Trains `seeds` members of one sweep point (`RunConfig`) together."""

  def __init__(self, run: RunConfig, data, seeds: tuple[int, ...] | None = None,
               mesh: Mesh | None = None, label: str | None = None):
    """`seeds` default to `range(run.seeds)`, each a member at every
    combination of the member values (`run.members`); `mesh` places them
    (`placement.Placement`: a `("data",)` mesh splits the batches over its
    devices, a `(members, data)` one the members over its member groups
    too); `label` names the run in log lines (default: the arm's
    label; a sweep adds its grid point, so that two points' runs are told
    apart)."""
    self.run_config, self.arm, self.data = run, run.arm, data
    self.label = label or run.arm.label
    self.members = run.members(None if seeds is None else tuple(int(s) for s in seeds))
    self.seeds = tuple(m.seed for m in self.members)  # [E]: a seed repeats across values
    self.tok = data.tokenizer
    self.model_cls, self.model_config = run.build_model(data)
    self.graphdef, state = models.create_ensemble(self.model_cls, self.model_config, self.seeds)
    params, rest = state.split(nnx.Param, ...)
    self.num_params = models.count_params(jax.tree.map(lambda x: x[0], params))
    self.tx = run.optimizer.make(run.member_fields)
    opt_state = jax.vmap(self.tx.init)(params)
    if run.member_fields:
      opt_state = run_config_lib.with_member_values(opt_state, self._member_values())
    best_params = jax.tree.map(jnp.copy, params)  # params get donated
    self.placement = Placement(mesh)
    self.placement.check_divisible(batch_size=run.data.batch_size,
                                   eval_batch_size=run.evaluation.eval_batch_size)
    self.placement.check_members(len(self.seeds))
    params, self.rest, opt_state, best_params = self.placement.stack_tree(
        (params, rest, opt_state, best_params))
    members = len(self.seeds)
    self.state = TrainState(
        params=params, opt_state=opt_state, best_params=best_params,
        best_bleu=np.full(members, -1.0), best_step=np.zeros(members, np.int64),
        diverged_at=np.zeros(members, np.int64), loss=np.full(members, np.nan),
        best_ppl=np.full(members, np.inf))
    self.evaluator = evaluation.Evaluator(run, data, members, self.graphdef, self.rest,
                                          params, self.placement, label=self.label)
    self._train_step = self._build_train_step()
    self._diag_step = self._build_diag_step()
    self._members_finite = jax.jit(lambda params: functools.reduce(
        jnp.logical_and, [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
                          for x in jax.tree.leaves(params)]))  # [E]
    self.diverged_loss = DIVERGED_LOSS_FACTOR * math.log(self.tok.vocab_size)

  def _member_values(self) -> dict[str, list[float]]:
    """`{field: [E] values}` of the member fields, in member order."""
    return {name: [dict(m.values)[name] for m in self.members]
            for name in self.run_config.member_fields}

  def check_members(self, arrays, where: str) -> None:
    """A ValueError of one line if the optimiser state of a checkpoint
    (`arrays`, read from `where`) holds other member values than this run's:
    its members would go on at the checkpoint's values."""
    fields = self.run_config.member_fields
    if not fields:
      return
    held = run_config_lib.member_values(arrays["opt_state"], fields)
    for name, own in self._member_values().items():
      own = np.asarray(own, held[name].dtype)
      if not np.array_equal(held[name], own):
        raise ValueError(
            f"{where} holds members of {name} {held[name].tolist()}, not {own.tolist()}: "
            "a run's --members cannot change; use another --workdir or delete that folder.")

  @property
  def params(self):
    return self.state.params

  @property
  def opt_state(self):
    return self.state.opt_state

  # --- compiled functions -------------------------------------------------

  def _build_train_step(self):
    opt = self.run_config.optimizer
    return steps.ensemble_train_step(self.graphdef, self.tx, self.seeds, self.placement,
                                     pad_id=self.tok.pad_id,
                                     label_smoothing=opt.label_smoothing,
                                     dropout=self.run_config.model.dropout > 0.0)

  def _build_diag_step(self):
    pad, ls = self.tok.pad_id, self.run_config.optimizer.label_smoothing

    # The Transformer also reports every statistic per layer and kind, from
    # what its attention modules sow (`diagnostics.transformer_attention`).
    per_layer = self.run_config.family == "transformer"
    logged = registry.get(self.arm.score).logged_params if self.arm.has_attention else {}

    def member(params, rest, src, tgt_in, tgt_out):
      def model_out(off):
        model = nnx.merge(self.graphdef, params, rest)
        if not per_layer:
          return model(src, tgt_in, deterministic=True, score_offset=off)
        (logits, aux), attention = diagnostics.transformer_attention(
            model, src, tgt_in, deterministic=True, score_offset=off)
        return logits, dict(aux, attention=attention)

      scores_shape = jax.eval_shape(lambda: model_out(None)[1]["scores"])  # no compute
      if scores_shape is None:  # no attention: nothing to look inside
        nan = jnp.float32(jnp.nan)
        return {"logit_std": nan, "entropy": nan, "saturated": nan, "max_logit": nan,
                "grad_norm": nan}

      def loss_of_offset(off):
        logits, aux = model_out(off)
        return steps.token_loss(logits, tgt_out, pad, ls)[0], aux

      # d loss / d attention logits, and the logits themselves, in one pass.
      grad, aux = jax.grad(loss_of_offset, has_aux=True)(
          jnp.zeros(scores_shape.shape, jnp.float32))
      query_valid = diagnostics.query_valid_like(aux["scores"].ndim, tgt_out != pad)
      stats = diagnostics.softmax_stats(aux["scores"], aux["weights"], aux["key_valid"],
                                        query_valid)
      stats["grad_norm"] = jnp.sqrt(jnp.sum(jnp.square(grad)))
      if "attention" in aux:
        stats.update(diagnostics.per_layer_stats(aux["attention"], tgt_out != pad))
      if logged:  # the learned parameters the score's registry entry names
        stats.update(diagnostics.logged_params(params, logged))
      return stats

    # Each device its own members on a `members` mesh, as the training step.
    return jax.jit(placement_lib.over_members_on(self.placement.mesh, member,
                                                 (0, 0, None, None, None)))

  # --- steps ----------------------------------------------------------------

  def train_batches(self, start_step: int) -> Iterator:
    """The batches the run trains on, one per step, from step `start_step`
    on: the training split shuffled by the data seed, repeated and filtered
    to `max_length`. The stream is a pure function of the seed, so a resumed
    run goes on with the batches it would have had; a timing of the step
    (`measure/step_time.py`) takes the same batches as the run."""
    data = self.run_config.data
    it = self.data.batches("train", data.batch_size, seed=data.data_seed, shuffle=True,
                           repeat=True, max_length=data.max_length)
    for _ in range(start_step):  # the stream is a pure function of the seed
      next(it)
    return it

  def step(self, state: TrainState, batch) -> TrainState:
    """`state` after one optimiser step of every member on `batch` (its
    parameters and optimiser state are donated); `loss` holds the losses."""
    src, tgt_in, tgt_out = self.evaluator.teacher_forced(batch)
    try:
      params, opt_state, loss = self._train_step(
          state.params, self.rest, state.opt_state, jnp.int32(state.step), src, tgt_in, tgt_out)
      loss = multihost.to_host(loss)  # waits for the step: honest timings
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
        raise
      # XLA's own report is some 50 lines of traceback and allocator state.
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise OutOfMemory(
          f"[{self.label}] out of memory in training step {state.step + 1} ({len(self.seeds)} "
          f"members, a batch of {np.shape(src)[0]:,} sentences of {np.shape(src)[1]} tokens): "
          f"lower --batch_size (or --seeds, --members); XLA: {first[:200]}") from None
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1, loss=loss)

  def diagnose(self, params, batch) -> dict[str, np.ndarray]:
    """Softmax diagnostics (`diagnostics.softmax_stats`) of `params` on `batch`, `[E]` each."""
    src, tgt_in, tgt_out = self.evaluator.teacher_forced(batch)
    stats = self._diag_step(params, self.rest, src, tgt_in, tgt_out)
    return {k: multihost.to_host(v).astype(np.float64) for k, v in stats.items()}

  def mark_diverged(self, state: TrainState, bad, why: str,
                    log: Callable[[str], None] = print) -> TrainState:
    """`state` with the members flagged in `bad [E]` recorded as diverged at
    its step (the first time only, in one line)."""
    new = np.asarray(bad) & (state.diverged_at == 0)
    if not new.any():
      return state
    if self.run_config.member_fields:
      who = f"member(s) {[m.label for m, n in zip(self.members, new) if n]}"
    else:
      who = f"seed(s) {[s for s, n in zip(self.seeds, new) if n]}"
    log(f"[{self.label}] {who} diverged at step {state.step} ({why}); "
        "recorded as diverged, no BLEU")
    return state.replace(diverged_at=np.where(new, state.step, state.diverged_at))

  def check_params(self, state: TrainState, log: Callable[[str], None]) -> TrainState:
    """`state` with members that have any non-finite parameter marked diverged."""
    finite = multihost.to_host(self._members_finite(state.params))
    return self.mark_diverged(state, ~finite, "non-finite parameters", log)

  # --- the run --------------------------------------------------------------

  def run(self, run_dir: str, *, log: Callable[[str], None] = print,
          deadline: float | None = None,
          sweep: progress.SweepProgress | None = None) -> actions_lib.GroupResult | None:
    """Trains to the configured steps, resuming from `run_dir` if it holds a
    checkpoint, then evaluates the best parameters on the test split. With
    `sweep` (the sweep this run is one of), its progress lines also say the
    whole sweep's time left.

    Returns None when `deadline` (a `time.time()` value) stops it early.
    Raises `interrupts.Interrupted` after the step during which SIGTERM or
    Ctrl-C came (once `interrupts.install` made them requests), with that
    step's checkpoint saved.
    """
    os.makedirs(run_dir, exist_ok=True)
    paths = RunDir(run_dir)
    ckpt = checkpoints.Checkpointer(paths.checkpoints)
    restored = ckpt.restore_latest(self.state.arrays(), log=log)
    if restored is not None:
      arrays, meta = restored
      self.check_members(arrays, f"the checkpoint of step {meta['step']} in {paths.checkpoints}")
      if "best_ppl" not in meta:  # a checkpoint from before ties were broken by perplexity
        history = MetricsLog(paths.metrics, write=False).read()
        # Every process reads the same log: the workdir is shared, as the
        # checkpoint is, and the primary's trimming below keeps every line up
        # to the checkpoint's step, so every process gets the same values.
        meta = with_logged_best_ppl(meta, history, self.seeds)
      self.state = self.state.restored(arrays, meta)
      moved = placement_lib.layout_change(meta.get("layout"), self.placement.layout())
      log(f"[{self.label}] resumed at step {self.state.step}" + (f"; {moved}" if moved else ""))
    searched = time.time()
    self.evaluator.check_memory(log)
    log(f"[{self.label}] evaluation batches chosen in {time.time() - searched:.1f} s")
    board = Board(run_dir, self.seeds, members=[m.keys for m in self.members],
                  start_step=self.state.step, enabled=multihost.is_primary(), log=log)
    metrics = MetricsLog(paths.metrics, log=log,
                         write=multihost.is_primary(), board=board)
    metrics.truncate_after(self.state.step)  # drop what a killed run logged past its checkpoint
    try:
      run = actions_lib.RunActions(self, ckpt, metrics, board, log, deadline, sweep)
      self.state, stop = periodic.train_loop(
          self.state, self.run_config.optimizer.steps, run.advance,
          self.train_batches(self.state.step), run.actions())
      self.state, result = run.finish(self.state, stop)
      return result
    finally:
      board.close()

