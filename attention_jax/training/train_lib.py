"""Training and evaluation of one (arm, dim) configuration for several seeds.

The seeds of a configuration form an *ensemble axis* E: their parameters and
optimiser states are stacked and every step is one `jax.vmap`-ed, jit-compiled
program, so N seeds cost one compilation and one dispatch per step. All
members see the same batches; they differ in initialisation and dropout.

Shape glossary: E ensemble members (seeds), B batch, S source length,
T target length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import time
from typing import Any, Callable, Iterator

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import optax

from attention_jax import decoding
from attention_jax import models
from attention_jax import registry
from attention_jax.data import batching
from attention_jax.data import input_pipeline
from attention_jax.training import board as board_lib
from attention_jax.training import checkpoints
from attention_jax.training import diagnostics
from attention_jax.training import interrupts
from attention_jax.training import multihost
from attention_jax.training import rundir
from attention_jax.training import steps
from attention_jax.training.config import Arm, ExperimentConfig



# ----------------------------------------------------------------------------
# Model and optimiser construction.


def model_for(cfg: ExperimentConfig, arm: Arm, data):
  """(model class, model config) of one sweep point, built once per run.

  `cfg.model` picks the family; `arm` says what its attention is. The
  Transformer gets `cfg.encoder_layers` encoder and `cfg.decoder_layers`
  decoder layers, and a position table long enough for `data`
  (`transformer_positions`). The RNN's `location` score has one output per
  source position, so it is built for the widest batch of `data`
  (`batch_width`): evaluation is not length-filtered, and sized by
  `cfg.max_length` it failed at the first validation. `qk_norm` only takes
  its initial gain from the length and keeps the training limit
  `cfg.max_length + 1`, the length its runs were made with.
  """
  tok = data.tokenizer
  dtype = jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32
  special = dict(vocab_size=tok.vocab_size, pad_id=tok.pad_id, eos_id=tok.eos_id,
                 sos_id=tok.sos_id, dtype=dtype, param_dtype=jnp.float32, dropout=cfg.dropout)
  if cfg.model == "rnn":
    attention = dict(decoder=arm.decoder)
    if arm.has_attention:
      attention.update(score=arm.score, attention_dim=arm.attention_dim)
      if arm.score == "location":
        attention["max_source_length"] = batch_width(data)
      elif registry.SCORES[arm.score].needs_length:
        attention["max_source_length"] = cfg.max_length + 1  # + <eos>
    return models.Seq2Seq, models.Seq2SeqConfig(
        embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
        encoder_layers=cfg.encoder_layers, bidirectional=True,
        decoder_layers=cfg.decoder_layers, cell=cfg.cell, **attention, **special)
  return models.Transformer, models.TransformerConfig(
      num_layers=cfg.decoder_layers, encoder_layers=cfg.encoder_layers,
      d_model=cfg.hidden_dim, num_heads=cfg.num_heads, d_ff=cfg.ff_dim, score=arm.score,
      attention_dim=arm.attention_dim, pre_layer_norm=cfg.layer_norm == "pre",
      max_length=transformer_positions(data), **special)


def transformer_positions(data) -> int:
  """Rows of the Transformer's position table for `data`: evaluation batches
  are not length-filtered, so the longest source of the splits the trainer
  reads (train, validation, test), padded to its
  batch grid (`batching.padded_length`, + <eos>), must fit, and so must the
  longest output decoding gives that source (`decoding.output_length`)."""
  longest = max(int(data.token_ids(split)[0].lengths.max(initial=0))
                for split in ("train", "validation", "test"))
  source = int(batching.padded_length(longest + 1))
  return max(source, decoding.output_length(None, source))


def batch_width(data) -> int:
  """The widest batch any pass over `data`'s train, validation or test split
  can give: a batch's sources and targets share one padded length
  (`batching.padded_length` of the longest of either, + <eos>), and
  evaluation passes keep sentences of every length."""
  longest = max(int(ids.lengths.max(initial=0))
                for split in ("train", "validation", "test") for ids in data.token_ids(split))
  return int(batching.padded_length(longest + 1))


def learning_rate_schedule(cfg: ExperimentConfig) -> optax.Schedule:
  """Linear warm-up, then constant or cosine decay to 10% at the end."""
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
        decay_steps=max(cfg.steps, cfg.warmup_steps + 1), end_value=0.1 * cfg.learning_rate)
  if cfg.warmup_steps:
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
         optax.constant_schedule(cfg.learning_rate)], [cfg.warmup_steps])
  return optax.constant_schedule(cfg.learning_rate)


def make_optimizer(cfg: ExperimentConfig) -> optax.GradientTransformation:
  """Adam (β₂ = `adam_b2`) on `learning_rate_schedule`, with global-norm clipping."""
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adam(learning_rate_schedule(cfg), b2=cfg.adam_b2))


# ----------------------------------------------------------------------------
# The ensemble trainer.


# A member counts as diverged once its training loss exceeds this many times
# ln(vocabulary size), the loss of the uniform prediction every model starts
# near and only goes below (lr 1e4 drove the smoke model's loss to ~1.3e5,
# a probe of absurd learning rates), or once its loss or any of its parameters is not finite.
DIVERGED_LOSS_FACTOR = 10.0


@dataclasses.dataclass
class GroupResult:
  """What one finished (arm, dim) configuration produced, per seed."""
  rows: list[dict[str, Any]]
  attention: dict[str, Any] | None  # one test sentence's alignment (seed 0), for plots
  # The final test translations: {"references": [N], "hypotheses": [E][N]}
  # (detokenised), kept for significance tests between runs.
  translations: dict[str, Any] | None = None


class EnsembleTrainer:
  """Trains `seeds` members of one (arm, dim) configuration together."""

  def __init__(self, cfg: ExperimentConfig, arm: Arm, data, seeds: tuple[int, ...],
               mesh: Mesh | None = None):
    self.cfg, self.arm, self.data = cfg, arm, data
    self.seeds = tuple(int(s) for s in seeds)
    self.tok = data.tokenizer
    self.model_cls, self.model_config = model_for(cfg, arm, data)
    self.graphdef, state = models.create_ensemble(self.model_cls, self.model_config, self.seeds)
    self.params, self.rest = state.split(nnx.Param, ...)
    self.num_params = models.count_params(
        jax.tree.map(lambda x: x[0], self.params))
    self.tx = make_optimizer(cfg)
    self.opt_state = jax.vmap(self.tx.init)(self.params)
    self.best_params = jax.tree.map(jnp.copy, self.params)  # params get donated
    self.best_bleu = np.full(len(self.seeds), -1.0)
    self.best_step = np.zeros(len(self.seeds), np.int64)
    self.diverged_at = np.zeros(len(self.seeds), np.int64)  # step it diverged; 0 = never
    self.mesh = mesh
    self._batch_sharding = None
    if mesh is not None and mesh.size > 1:
      for name in ("batch_size", "eval_batch_size"):
        if getattr(cfg, name) % mesh.size:
          raise ValueError(f"`{name}` ({getattr(cfg, name)}) must be divisible by the "
                           f"number of devices ({mesh.size}) for data parallelism.")
      self._batch_sharding = NamedSharding(mesh, P("data"))
      replicated = NamedSharding(mesh, P())
      self.params, self.rest, self.opt_state, self.best_params = jax.tree.map(
          functools.partial(_global_array, sharding=replicated),
          (self.params, self.rest, self.opt_state, self.best_params))
    self._train_step = self._build_train_step()
    self._eval_step = self._build_eval_step()
    self._diag_step = self._build_diag_step()
    self.val_beam_size = cfg.val_beam_size or cfg.beam_size
    self._decoders = {}  # (beam size, return_attention) -> compiled decoder
    self._eval_batches = {}  # (program, split) -> sentences per batch (`eval_batch_size`)
    self._members_finite = jax.jit(lambda params: functools.reduce(
        jnp.logical_and, [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
                          for x in jax.tree.leaves(params)]))  # [E]
    self.diverged_loss = DIVERGED_LOSS_FACTOR * math.log(self.tok.vocab_size)

  # --- evaluation memory -------------------------------------------------

  def eval_batch_size(self, program: str, split: str) -> int:
    """Sentences per batch of one evaluation program on `split`: `cfg.eval_batch_size`,
    or fewer where its compiled program would need more than `memory_budget()`.

    `program` is 'perplexity' or 'beam<K>' (K = 1: greedy), traced for the
    split's longest batch (`batching.padded_length` of its longest source
    and target). Its size is a cheap upper bound (`jaxpr_bytes`) when that
    fits, else XLA's memory analysis of the compiled program (arguments,
    outputs and temporaries). It matters because decoding holds a key/value cache of
    `heads × d_k × output length` per hypothesis and layer, which at d_k =
    1024 and beam 4 needs ~20 GB for 256 sentences. A ValueError, naming the
    budget, if even one sentence does not fit. With the batch sharded over
    several devices, `cfg.eval_batch_size` as it is.
    """
    key = (program, split)
    if self.mesh is not None and self.mesh.size > 1:
      return self.cfg.eval_batch_size  # sharded over devices: each holds a share
    if key not in self._eval_batches:
      self._eval_batches[key] = self._largest_fitting_batch(program, split)
    return self._eval_batches[key]

  def _largest_fitting_batch(self, program: str, split: str) -> int:
    """The largest batch up to `cfg.eval_batch_size` whose program fits the
    budget: memory grows linearly with the batch, so a line through the
    sizes measured so far proposes the next, kept strictly between the
    largest size known to fit and the smallest known not to."""
    budget = self.memory_budget()
    fits, fails = 0, self.cfg.eval_batch_size + 1
    size, seen = self.cfg.eval_batch_size, {}
    while fails - fits > 1:
      seen[size] = self._program_bytes(program, split, size)
      if seen[size] <= budget:
        fits = size
      else:
        fails = size
      if fails - fits <= 1:
        break
      (b0, m0), (b1, m1) = sorted(seen.items())[:1] * 2 if len(seen) == 1 else sorted(
          seen.items(), key=lambda kv: abs(kv[1] - budget))[:2]
      slope = (m1 - m0) / (b1 - b0) if b1 != b0 else m0 / b0
      guess = int(b0 + (budget - m0) / slope) if slope > 0 else fits + 1
      size = min(max(guess, fits + 1), fails - 1)
    if fits == 0:
      raise ValueError(
          f"{self.arm.label}: {program} on {split} needs {seen[1] / 2**30:.1f} GiB for "
          f"one sentence, over the evaluation budget of {budget / 2**30:.1f} GiB "
          "(--eval_memory_gb); raise it or make the model smaller.")
    return fits

  def memory_budget(self) -> int:
    """Bytes one evaluation program may use: `--eval_memory_gb`, or half the
    memory the system has available now, shared by the `--workers`."""
    if self.cfg.eval_memory_gb:
      return int(self.cfg.eval_memory_gb * 2**30)
    return int(0.5 * available_memory() / max(self.cfg.workers, 1))

  def _program_bytes(self, program: str, split: str, size: int) -> int:
    src_ids, tgt_ids = self.data.token_ids(split)
    s = int(batching.padded_length(int(src_ids.lengths.max(initial=0)) + 1))
    t = int(batching.padded_length(int(tgt_ids.lengths.max(initial=0)) + 1))
    ints = lambda n: jax.ShapeDtypeStruct((size, n), jnp.int32)
    if program == "perplexity":
      traced = self._eval_step.trace(self.params, self.rest, ints(s), ints(t), ints(t))
    else:
      traced = self._decoder(int(program.removeprefix("beam"))).trace(
          self.params, self.rest, ints(s))
    # Every value the program makes, summed, twice over (a loop's carry
    # exists as input and output of its body) bounds what it can hold at
    # once; when that bound fits, the compiler's own count is not needed.
    bound = 2 * jaxpr_bytes(traced.jaxpr)
    if bound <= self.memory_budget():
      return bound
    memory = traced.lower().compile().memory_analysis()
    return int(memory.argument_size_in_bytes + memory.output_size_in_bytes
               + memory.temp_size_in_bytes)

  def check_eval_memory(self, log: Callable[[str], None] = print) -> None:
    """Chooses every evaluation batch before training (so a run that cannot
    evaluate stops before the work it would lose) and logs the reduced ones."""
    for program, split in ((f"beam{self.val_beam_size}", "validation"),
                           ("perplexity", "validation"),
                           (f"beam{self.cfg.beam_size}", "test")):
      size = self.eval_batch_size(program, split)
      if size < self.cfg.eval_batch_size:
        log(f"[{self.arm.label}] {program} on {split}: {size} sentences per batch "
            f"(not {self.cfg.eval_batch_size}) to fit the evaluation budget of "
            f"{self.memory_budget() / 2**30:.1f} GiB")

  def mark_diverged(self, bad, step: int, why: str, log: Callable[[str], None] = print):
    """Records members flagged in `bad [E]` as diverged at `step` (first time only)."""
    new = np.asarray(bad) & (self.diverged_at == 0)
    if new.any():
      self.diverged_at = np.where(new, step, self.diverged_at)
      seeds = [s for s, n in zip(self.seeds, new) if n]
      log(f"[{self.arm.label}] seed(s) {seeds} diverged at step {step} ({why}); "
          "recorded as diverged, no BLEU")

  def _check_params(self, step: int, log: Callable[[str], None]):
    """Marks members with any non-finite parameter as diverged at `step`."""
    self.mark_diverged(~multihost.to_host(self._members_finite(self.params)), step,
                       "non-finite parameters", log)

  # --- compiled functions -------------------------------------------------

  def _apply(self, params, rest, src, tgt_in, **kw):
    model = nnx.merge(self.graphdef, params, rest)
    return model(src, tgt_in, **kw)

  def _build_train_step(self):
    cfg = self.cfg
    step = functools.partial(steps.train_step, self.graphdef, self.tx, pad_id=self.tok.pad_id,
                             label_smoothing=cfg.label_smoothing, dropout=cfg.dropout > 0.0)
    seeds = jnp.asarray(self.seeds, jnp.uint32)

    def member(params, rest, opt_state, seed, step_index, src, tgt_in, tgt_out):
      key = jax.random.fold_in(jax.random.PRNGKey(seed), step_index)
      return step(params, rest, opt_state, src, tgt_in, tgt_out, key)

    def step_fn(params, rest, opt_state, step_index, src, tgt_in, tgt_out):
      return jax.vmap(member, in_axes=(0, 0, 0, 0, None, None, None, None))(
          params, rest, opt_state, seeds, step_index, src, tgt_in, tgt_out)

    return jax.jit(step_fn, donate_argnums=(0, 2))

  def _build_eval_step(self):
    member = functools.partial(steps.eval_step, self.graphdef, pad_id=self.tok.pad_id)
    return jax.jit(jax.vmap(member, in_axes=(0, 0, None, None, None)))

  def _build_diag_step(self):
    pad, ls = self.tok.pad_id, self.cfg.label_smoothing

    # The Transformer also reports every statistic per layer and kind.
    per_layer = dict(return_attention=True) if self.cfg.model == "transformer" else {}

    def member(params, rest, src, tgt_in, tgt_out):
      model_out = lambda off: self._apply(params, rest, src, tgt_in, deterministic=True,
                                          score_offset=off, **per_layer)
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
      if self.arm.score == "qk_norm":  # its logits are bounded by the learned g
        stats.update(diagnostics.qk_norm_gains(params))
      return stats

    return jax.jit(jax.vmap(member, in_axes=(0, 0, None, None, None)))

  def _decoder(self, beam_size: int, return_attention: bool = False):
    """The compiled vmapped decoder (greedy when `beam_size` is 1); carrying
    attention rows through the search costs time, so only heat maps ask."""
    key = (beam_size, return_attention)
    if key not in self._decoders:
      cfg = self.cfg

      def member(params, rest, src):
        model = nnx.merge(self.graphdef, params, rest)
        if beam_size == 1:
          return decoding.greedy(model, src, return_attention=return_attention)
        return decoding.beam_search(model, src, beam_size=beam_size,
                                    length_penalty=cfg.length_penalty,
                                    return_attention=return_attention)

      self._decoders[key] = jax.jit(jax.vmap(member, in_axes=(0, 0, None)))
    return self._decoders[key]

  # --- data ---------------------------------------------------------------

  def _put(self, *arrays):
    if self._batch_sharding is None:
      return tuple(jnp.asarray(a) for a in arrays)
    return tuple(_global_array(a, self._batch_sharding) for a in arrays)

  def _teacher_forced(self, batch):
    """`(src, tgt_in, tgt_out)` of a batch on the devices (`tgt_in` shifted right)."""
    tgt_in = steps.decoder_input(batch.tgt, self.tok.sos_id, self.tok.pad_id)
    return self._put(batch.src, tgt_in, batch.tgt)

  def _replicated(self, array):
    """`array` (the same in every process) as a device array beside the parameters."""
    if self.mesh is None:
      return jnp.asarray(array)
    return _global_array(array, NamedSharding(self.mesh, P()))

  def _train_batches(self, start_step: int) -> Iterator:
    it = self.data.batches("train", self.cfg.batch_size, seed=self.cfg.data_seed, shuffle=True,
                           repeat=True, max_length=self.cfg.max_length)
    for _ in range(start_step):  # the stream is a pure function of the seed
      next(it)
    return it

  def train_step(self, batch, step: int) -> np.ndarray:
    """One optimiser step of every member on `batch`; returns the losses `[E]`."""
    src, tgt_in, tgt_out = self._teacher_forced(batch)
    self.params, self.opt_state, loss = self._train_step(
        self.params, self.rest, self.opt_state, jnp.int32(step), src, tgt_in, tgt_out)
    return multihost.to_host(loss)  # waits for the step: honest timings

  # --- evaluation ---------------------------------------------------------

  def translate(self, params, split: str, limit: int, beam_size: int):
    """Translations of the first `limit` examples of a split (0 = all).

    Returns `(hypotheses [E][N] str, references [N] str)`.
    """
    sources, references = self.data.texts(split)
    n = len(sources) if not limit else min(limit, len(sources))
    decode = self._decoder(beam_size)
    hyps = [[""] * n for _ in self.seeds]
    for batch in self.data.batches(split, self.eval_batch_size(f"beam{beam_size}", split),
                                   shuffle=False, repeat=False, limit=n):
      (src,) = self._put(batch.src)
      tokens = multihost.to_host(decode(params, self.rest, src))  # [E, B, L]
      for row, index in enumerate(batch.index):
        if index >= 0:
          for e in range(len(self.seeds)):
            hyps[e][index] = self.tok.decode(tokens[e, row].tolist())
    return hyps, references[:n]

  def bleu(self, params, split: str, limit: int, beam_size: int) -> np.ndarray:
    """Corpus BLEU (sacrebleu, detokenised text) per member, `[E]`."""
    hyps, refs = self.translate(params, split, limit, beam_size)
    return np.asarray([input_pipeline.corpus_bleu(h, refs) for h in hyps])

  def perplexity(self, params, split: str) -> np.ndarray:
    """Teacher-forced perplexity per target token (EOS included, padding
    excluded) over the whole split, per member, `[E]`: exp(Σ NLL / #tokens)."""
    nll, ntok = np.zeros(len(self.seeds)), 0.0
    for batch in self.data.batches(split, self.eval_batch_size("perplexity", split),
                                   shuffle=False, repeat=False):
      src, tgt_in, tgt_out = self._teacher_forced(batch)
      batch_nll, batch_ntok = self._eval_step(params, self.rest, src, tgt_in, tgt_out)
      nll += multihost.to_host(batch_nll).astype(np.float64)
      ntok += float(multihost.to_host(batch_ntok)[0])
    return np.exp(nll / max(ntok, 1.0))

  def alignment(self, params, split: str = "test") -> dict[str, Any]:
    """Member 0's tokens and cross-attention weights for example 0 of `split`
    (None for the decoders without attention)."""
    if not self.arm.has_attention:
      return None
    batch = next(self.data.batches(split, 1, shuffle=False, repeat=False, limit=1))
    src = self._replicated(batch.src)  # one sentence: not split over devices
    tokens, weights = self._decoder(self.cfg.beam_size, return_attention=True)(
        params, self.rest, src)  # [E, 1, L], [E, 1, L, S]
    return {"src": self._pieces(batch.src[0]), "hyp": self._pieces(multihost.to_host(tokens)[0, 0]),
            "weights": multihost.to_host(weights)[0, 0].astype(np.float32)}

  def diagnose(self, batch) -> dict[str, np.ndarray]:
    src, tgt_in, tgt_out = self._teacher_forced(batch)
    stats = self._diag_step(self.params, self.rest, src, tgt_in, tgt_out)
    return {k: multihost.to_host(v).astype(np.float64) for k, v in stats.items()}

  # --- checkpoint state -----------------------------------------------------

  def arrays(self) -> dict[str, Any]:
    return {"params": self.params, "opt_state": self.opt_state,
            "best_params": self.best_params}

  def load_arrays(self, arrays):
    self.params, self.opt_state, self.best_params = (
        arrays["params"], arrays["opt_state"], arrays["best_params"])

  # --- the loop -----------------------------------------------------------

  def run(self, run_dir: str, *, log: Callable[[str], None] = print,
          deadline: float | None = None) -> GroupResult | None:
    """Trains to `cfg.steps`, resuming from `run_dir` if it holds a checkpoint.

    Returns None when `deadline` (a `time.time()` value) stops it early.
    Raises `interrupts.Interrupted` after the step during which SIGTERM or
    Ctrl-C came (once `interrupts.install` made them requests), with that
    step's checkpoint saved.
    """
    cfg = self.cfg
    os.makedirs(run_dir, exist_ok=True)
    ckpt = checkpoints.Checkpointer(rundir.RunDir(run_dir).checkpoints)
    meta = {"step": 0, "train_seconds": 0.0, "best_bleu": self.best_bleu.tolist(),
            "best_step": self.best_step.tolist(), "diverged_at": self.diverged_at.tolist()}
    restored = ckpt.restore_latest(self.arrays(), log=log)
    if restored is not None:
      arrays, meta = restored
      self.load_arrays(arrays)
      self.best_bleu = np.asarray(meta["best_bleu"], np.float64)
      self.best_step = np.asarray(meta["best_step"], np.int64)
      self.diverged_at = np.asarray(meta.get("diverged_at", self.diverged_at), np.int64)
      log(f"[{self.arm.label}] resumed at step {meta['step']}")
    self.check_eval_memory(log)
    board = board_lib.Board(run_dir, self.seeds, start_step=meta["step"],
                            enabled=multihost.is_primary(), log=log)
    metrics = MetricsLog(rundir.RunDir(run_dir).metrics, log=log,
                         write=multihost.is_primary(), board=board)
    metrics.truncate_after(meta["step"])  # drop what a killed run logged past its checkpoint
    try:
      return self._run(ckpt, meta, metrics, board, log, deadline)
    finally:
      board.close()

  def _run(self, ckpt, meta, metrics, board, log, deadline) -> GroupResult | None:
    """The training loop and final evaluation of `run`."""
    cfg = self.cfg
    learning_rate = learning_rate_schedule(cfg)

    diag_batch = next(self.data.batches("validation", cfg.batch_size, shuffle=False,
                                        repeat=False))
    step = meta["step"]
    start_step = step
    slowest_validation = 0.0  # seconds, of this call (the first one compiles the decoder)
    train_seconds = meta["train_seconds"]
    batches = self._train_batches(step)
    window_tokens, window_seconds, window_start = 0, 0.0, time.time()
    while step < cfg.steps:
      batch = next(batches)
      t0 = time.time()
      loss = self.train_step(batch, step)
      train_seconds += time.time() - t0
      window_seconds += time.time() - t0
      step += 1
      window_tokens += int((batch.tgt != self.tok.pad_id).sum()) * len(self.seeds)
      self.mark_diverged(~(np.abs(loss) <= self.diverged_loss), step,  # NaN is caught too
                         f"loss {loss.tolist()}", log)
      if self.diverged_at.all():
        log(f"[{self.arm.label}] every member diverged: training stops")
        break

      if step % cfg.log_every == 0 or step == cfg.steps:
        # tokens/s over training steps only; the ETA from wall time (with evaluation).
        rate = window_tokens / max(window_seconds, 1e-9)
        board.every_seed(step, {"learning_rate": float(learning_rate(step)),
                                "tokens_per_second": rate})
        eta = (cfg.steps - step) * (time.time() - window_start) / max(cfg.log_every, 1)
        log(f"[{self.arm.label}] step {step}/{cfg.steps} loss "
            f"{' '.join(f'{x:.3f}' for x in loss)} | {rate:,.0f} target tok/s | "
            f"ETA {eta / 60:.1f} min")
        window_tokens, window_seconds, window_start = 0, 0.0, time.time()
      if step % cfg.diag_every == 0 or step == cfg.steps:
        stats = self.diagnose(diag_batch)
        for e, seed in enumerate(self.seeds):
          metrics.append({"step": step, "seed": seed, "loss": float(loss[e]),
                          **{k: _num(v[e]) for k, v in stats.items()}})
      if step % cfg.eval_every == 0 or step == cfg.steps:
        validation_start = time.time()
        self._check_params(step, log)  # the loss above predates this step's update
        ok = self.diverged_at == 0
        scores = np.where(ok, self.bleu(self.params, "validation", cfg.eval_examples,
                                        self.val_beam_size), np.nan)
        ppl = np.where(ok, self.perplexity(self.params, "validation"), np.nan)
        better = scores > self.best_bleu
        self.best_bleu = np.where(better, scores, self.best_bleu)
        self.best_step = np.where(better, step, self.best_step)
        self.best_params = _keep_better(self._replicated(better), self.params,
                                        self.best_params)
        for e, seed in enumerate(self.seeds):
          metrics.append({"step": step, "seed": seed,
                          "val_bleu": None if np.isnan(scores[e]) else float(scores[e]),
                          "val_ppl": _num(ppl[e])})
        log(f"[{self.arm.label}] step {step}: validation BLEU "
            f"{' '.join(f'{s:.2f}' for s in scores)}, perplexity "
            f"{' '.join(f'{p:.2f}' for p in ppl)}")
        slowest_validation = max(slowest_validation, time.time() - validation_start)
      saved = step % cfg.checkpoint_every == 0 or step == cfg.steps
      if saved:
        self._save(ckpt, board, step, train_seconds)
        if (deadline is not None and step < cfg.steps
            and multihost.agree(time.time() > deadline)):
          log(f"[{self.arm.label}] time budget reached at step {step}; "
              "checkpoint saved, re-run the same command to resume")
          return None
      # SIGTERM or Ctrl-C (`interrupts`): the steps so far are kept, and
      # every process stops at the same step.
      if multihost.anywhere(interrupts.requested() is not None):
        if not saved:
          self._save(ckpt, board, step, train_seconds)
        signum = interrupts.requested() or signal.SIGTERM
        log(f"[{self.arm.label}] {signal.Signals(signum).name}: checkpoint saved at step "
            f"{step}; re-run the same command to resume")
        raise interrupts.Interrupted(signum)

    if deadline is not None and step == cfg.steps > start_step:
      # The last checkpoint is saved: a piece that would pass its deadline in
      # the final test decode stops here, and the next one only evaluates.
      estimate = final_evaluation_seconds(
          slowest_validation, self._sentences("validation", cfg.eval_examples),
          self.val_beam_size, self._sentences("test", cfg.test_examples), cfg.beam_size)
      if multihost.agree(time.time() + estimate > deadline):
        log(f"[{self.arm.label}] trained to step {step}; the final evaluation (estimated "
            f"{estimate:.0f} s) would pass the time budget: checkpoint saved, re-run the "
            "same command to evaluate")
        return None
    self._check_params(step, log)
    ok = self.diverged_at == 0
    test_hyps, test_refs = self.translate(self.best_params, "test", cfg.test_examples,
                                          cfg.beam_size)
    test_hyps = [h if good else None for h, good in zip(test_hyps, ok)]
    test_scores = [input_pipeline.corpus_bleu(h, test_refs) if h is not None else None
                   for h in test_hyps]
    best_ppl = np.where(ok, self.perplexity(self.best_params, "validation"), np.nan)
    final = self.diagnose(diag_batch)
    rows = []
    for e, seed in enumerate(self.seeds):
      rows.append({
          "arm": self.arm.name, "dim": self.arm.attention_dim, "seed": seed, "model": cfg.model,
          "dataset": cfg.dataset, "params": self.num_params, "steps": step,
          "train_seconds": round(train_seconds, 2),
          "val_bleu": round(float(self.best_bleu[e]), 4) if ok[e] else None,
          "best_step": int(self.best_step[e]),
          "test_bleu": round(float(test_scores[e]), 4) if ok[e] else None,
          "val_ppl": _num(best_ppl[e]),
          "diverged_at_step": int(self.diverged_at[e]) or None,
          "diagnostics": {k: _num(v[e]) for k, v in final.items()},
      })
    for e, seed in enumerate(self.seeds):
      board.row({"step": step, "seed": seed, "test_bleu": test_scores[e]})
    attention = self.alignment(self.best_params, "test")
    return GroupResult(rows=rows, attention=attention,
                       translations={"references": test_refs, "hypotheses": test_hyps})

  def _sentences(self, split: str, limit: int) -> int:
    """How many sentences of `split` an evaluation with `limit` (0 = all) reads."""
    total = len(self.data.texts(split)[0])
    return total if not limit else min(limit, total)

  def _save(self, ckpt, board, step: int, train_seconds: float) -> None:
    """The checkpoint of `step`: arrays and the bookkeeping a resume needs."""
    board.flush()  # on disk before the checkpoint: a resume purges only what follows
    ckpt.save(step, self.arrays(), {"step": step, "train_seconds": train_seconds,
                                    "best_bleu": self.best_bleu.tolist(),
                                    "best_step": self.best_step.tolist(),
                                    "diverged_at": self.diverged_at.tolist()})

  def _pieces(self, ids) -> list[str]:
    """Token strings up to and including <eos>, for heat-map axes."""
    out = []
    for i in np.asarray(ids).tolist():
      if i == self.tok.pad_id:
        break
      if i == self.tok.eos_id:
        out.append("</s>")
      elif hasattr(self.tok, "id_to_piece"):  # SentencePiece: show sub-word pieces
        out.append(self.tok.id_to_piece(i))
      else:
        out.append(self.tok.decode([i]))
      if i == self.tok.eos_id:
        break
    return out


def final_evaluation_seconds(validation_seconds: float, validation_sentences: int,
                             validation_beam: int, test_sentences: int, test_beam: int) -> float:
  """A cautious estimate of the final evaluation's time from a validation's.

  The final evaluation decodes `test_sentences` with beam `test_beam` and
  repeats the validation's perplexity; a validation decoded
  `validation_sentences` with `validation_beam` (its time includes the
  perplexity, and for the first one the decoder's compilation). Beam search
  advances beam x batch hypotheses per step, so its cost is taken as linear in
  the beam, an upper bound where a device runs the hypotheses in parallel.
  0 when no validation was timed.
  """
  if validation_seconds <= 0 or validation_sentences <= 0:
    return 0.0
  work = (test_sentences * test_beam) / (validation_sentences * max(validation_beam, 1))
  return validation_seconds * max(1.0, work)


def jaxpr_bytes(jaxpr) -> int:
  """Bytes of every input and every value computed in `jaxpr` (a `ClosedJaxpr`
  or `Jaxpr`), with the bodies of loops, branches and nested calls counted
  once each: an upper bound on what the program holds live at any time,
  apart from a loop's carry being both input and output. 0 for None."""
  if jaxpr is None:
    return 0
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)

  def size(var):
    aval = getattr(var, "aval", None)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
      return 0
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

  def subs(value):
    if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
      yield value
    elif isinstance(value, (tuple, list)):
      for v in value:
        yield from subs(v)

  total = sum(size(v) for v in list(jaxpr.invars) + list(jaxpr.constvars))
  for eqn in jaxpr.eqns:
    total += sum(size(v) for v in eqn.outvars)
    for value in eqn.params.values():
      for sub in subs(value):
        inner = getattr(sub, "jaxpr", sub)
        total += jaxpr_bytes(inner) - sum(size(v) for v in inner.invars)
  return total


# What training keeps of every parameter whatever the batch: the parameter,
# Adam's two moments and the best-validation copy (`EnsembleTrainer.arrays`).
COPIES_PER_PARAMETER = 4


def state_bytes(cfg: ExperimentConfig, arm: Arm, data) -> tuple[int, int]:
  """`(parameters of one model, bytes of the training state of the ensemble)`
  of one sweep point: `COPIES_PER_PARAMETER` copies of every parameter for
  each of the `cfg.seeds` members. From `jax.eval_shape` of the model's
  construction: nothing is allocated, so an absurd size is measured, not
  attempted. Activations and evaluation come on top."""
  model_cls, model_config = model_for(cfg, arm, data)
  abstract = nnx.eval_shape(lambda: model_cls(model_config, rngs=nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  count = sum(int(np.prod(x.shape, dtype=np.int64)) for x in leaves)
  size = sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize for x in leaves)
  return count, size * COPIES_PER_PARAMETER * cfg.seeds


def check_memory(cfg: ExperimentConfig, arm: Arm, data, available: int | None = None) -> None:
  """A ValueError of one line, naming the size flags, if the training state
  of `arm` (`state_bytes`) exceeds the memory it would live in
  (`training_memory()` unless `available` is given), shared by the
  `cfg.workers` processes that train at once. Called before anything is
  made: a size that cannot fit ends in one line and no workdir, not in an
  out-of-memory traceback after the workdir was made."""
  count, need = state_bytes(cfg, arm, data)
  available = training_memory() if available is None else available
  share = max(cfg.workers, 1)
  if need > available / share:
    shared = f", shared by {share} --workers" if share > 1 else ""
    raise ValueError(
        f"{arm.label}: {cfg.seeds} seed(s) of {count:,} parameters need "
        f"{need / 2**30:,.1f} GiB for the parameters, Adam moments and best copy alone, "
        f"over the {available / 2**30:,.1f} GiB of memory available{shared}; lower --dims "
        "(--dim of experiments.train), --hidden_dim, --embed_dim, --ff_dim, --vocab_size "
        "or --seeds.")


def training_memory() -> int:
  """Bytes the training state may take: an accelerator's own memory (its
  `bytes_limit`; with data parallelism every device holds a replica), else
  what the system has available (`available_memory`)."""
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return available_memory()


def available_memory() -> int:
  """Bytes of memory the system can still give (Linux `MemAvailable`; with no
  /proc/meminfo, the physical memory)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _global_array(x, sharding):
  """`x` (the same in every process) placed with `sharding`, built from each
  process's own copy. `jax.device_put` of a process-local array onto devices
  of several processes gave arrays Orbax could not save (one buffer spanning
  both processes' devices; JAX 0.10.2, two CPU processes)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


@jax.jit  # compiled, so that with several processes the result is one global array
def _keep_better(better, new, old):
  """Members flagged in `better [E]` take `new`, the others keep `old`."""
  return jax.tree.map(
      lambda n, o: jnp.where(better.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, old)


def _num(x) -> float | None:
  x = float(x)
  return float(f"{x:.6g}") if math.isfinite(x) else None  # 6 significant digits


class MetricsLog:
  """Append-only JSON-lines log that a resumed run trims back to its checkpoint.

  The writer keeps every line it has read or written since `truncate_after`
  and checks before each append that the file still holds them (by size): a
  file deleted or cut while the run goes on is rewritten in full, with one
  warning line, instead of silently restarting from the next line.
  """

  def __init__(self, path: str, log: Callable[[str], None] = print, write: bool = True,
               board: "board_lib.Board | None" = None):
    self.path = path
    self.log = log
    self.write = write  # False: every call but `read` does nothing (not the primary process)
    self.board = board  # also sends every appended row to TensorBoard
    self._lines: list[str] | None = None  # None: a read-only view
    self._size = 0

  def read(self) -> list[dict]:
    if not os.path.exists(self.path):
      return []
    rows = []
    with open(self.path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill: dropped
          continue
        if isinstance(row, dict) and "step" in row:  # what else parses is no row of ours
          rows.append(row)
    return rows

  def truncate_after(self, step: int) -> None:
    if not self.write:
      return
    self._lines = [checkpoints.to_json(r) + "\n" for r in self.read() if r["step"] <= step]
    self._rewrite()

  def _rewrite(self) -> None:
    text = "".join(self._lines)
    checkpoints.atomic_write(self.path, text)
    self._size = len(text.encode())

  def append(self, row: dict) -> None:
    if not self.write:
      return
    if self.board is not None:
      self.board.row(row)
    line = checkpoints.to_json(row) + "\n"
    if self._lines is None:  # not opened for writing by truncate_after
      with open(self.path, "a") as f:
        f.write(line)
      return
    self._lines.append(line)
    try:
      intact = os.path.getsize(self.path) == self._size
    except FileNotFoundError:
      intact = False
    if not intact:
      self.log(f"warning: {self.path} was deleted or changed by something else during "
               f"the run; rewrote its {len(self._lines)} lines from memory")
      self._rewrite()
      return
    with open(self.path, "a") as f:
      f.write(line)
    self._size += len(line.encode())
