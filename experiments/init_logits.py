"""The footnote at initialisation: attention logits at step 0, before training.

    python -m experiments.init_logits --out=results/init_logits

Without `--out` it writes to `runs/init_logits` (a scratch folder, ignored by
git), never into the committed results. A bad flag or an `--out` that cannot
be a folder is one `error:` line, before any measurement.

Vaswani et al. 2017 (§3.2.1, footnote 4): if the components of q and k are
independent random variables with mean 0 and variance 1, then
q·k = Σ_i q_i k_i has mean 0 and variance d_k, so for large d_k the dot
products grow large and push the softmax into regions of tiny gradients;
hence the scores are divided by √d_k. This command checks the premise and the
consequence on the models of this repository, as they are built, on real
training batches, without a single training step.

Models (built by the sweep point's model config, `cfg.point(arm).model.build`,
and initialised as the trainer does, `Model(config, rngs=nnx.Rngs(--seed))`):
  transformer  d_model 128, 2 heads, d_ff 512, 2 encoder + 2 decoder layers
               (flags), post-LN, per-head query/key size d_k = the swept dim;
               every attention module: encoder self, decoder self (causal),
               cross, every layer.
  rnn          the quick preset's Seq2Seq: embeddings 128, one bidirectional
               GRU encoder layer 128, one GRU decoder layer 128, Luong decoder;
               attention dimension a = the swept dim; its cross attention.
Scores (arms): Transformer `dot` (unscaled), `scaled_dot`, `inverse_dim`,
`qk_norm`, `additive`; RNN `multiplicative` (unscaled),
`scaled_multiplicative`, `inverse_dim`, `qk_norm`, `additive`.

Initialisations:
  default  the model exactly as built: every projection Glorot/Xavier uniform
           (`layers.GLOROT`, variance 2 / (fan_in + fan_out), so with
           fan_out = H·d_k the query and key components shrink as d_k grows),
           zero biases.
  premise  the footnote's premise made true at step 0: in every attention
           module the query and key projection kernels are replaced by
           standard-normal draws and their biases by zeros, then each kernel
           is divided by the root mean square of its outputs on the first
           batch (valid positions, all components). That is LeCun normal
           (variance 1 / fan_in) scaled by 1 / √v_in, v_in the input's mean
           square, measured instead of assumed. The q and k components then
           have mean 0 over the draw and mean square 1; their variance over
           positions is lower, as the inputs share a common direction (e.g.
           the constant components of the positional encodings); both are
           reported. Rescaling one layer changes the inputs of the layers
           above it (and, in the RNN, the decoder states through input
           feeding), so the measure-and-divide step is repeated
           `--premise_passes` times. Nothing else changes: embeddings, value
           and output projections, FFNs, the additive score's own W_q, W_k,
           v and QKNorm's g keep their defaults.

Per (model, init, score, d_k, kind, layer), averaged over `--batches` training
batches (the trainer's first ones, `--data_seed`), with the padding masks of
source and target and the causal mask of decoder self attention, over the
query rows with at least two valid keys (a single key leaves the softmax no
choice: the first row of causal self attention):
  logit_std      std of the raw logits across the valid keys of a query row,
                 averaged over valid rows (`diagnostics.softmax_stats`)
  max_logit      largest raw logit at a valid (query, key) pair (max over
                 batches); max_abs_logit the largest |logit|
  saturated      share of valid rows whose largest weight > `diagnostics.SATURATION`
  entropy        mean row entropy / log(#valid keys)
  q_var, k_var   variance of each query / key component over valid positions,
                 averaged over components (the Transformer's over all heads);
                 q_mean_square, k_mean_square the same without centring
Logits are the model's own: the Transformer's are captured from its forward
pass (`nnx.capture` of `MultiHeadAttention.scores`), the RNN's from its
attention layer's `scores` on the decoder states of a teacher-forced pass.

Outputs in `--out`: `results.jsonl` (one row per measurement, with
provenance), `table.md` (log-log slopes of logit std and max |logit| against
d_k with 95% intervals, `training.scaling.loglog_slope`), `logit_std.png`,
and `README.md` (question, command, machine, wall time, tables, conclusion).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags
import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import benchmarking
from attention_jax import masks
from attention_jax import registry
from attention_jax.data import input_pipeline
from attention_jax.models.transformer import ATTENTION_KINDS
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import datasets
from attention_jax.training import diagnostics
from attention_jax.analysis import scaling
from attention_jax.training import steps
from experiments import common

MODELS = ("transformer", "rnn")
INITS = ("default", "premise")
KINDS = ("encoder_self", "decoder_self", "cross")
# The unscaled score of each model: the footnote's q·k.
UNSCALED = {"transformer": "dot", "rnn": "multiplicative"}
SCALED = {"transformer": "scaled_dot", "rnn": "scaled_multiplicative"}
DEFAULT_SCORES = {
    "transformer": ("dot", "scaled_dot", "inverse_dim", "qk_norm", "additive"),
    "rnn": ("multiplicative", "scaled_multiplicative", "inverse_dim", "qk_norm", "additive"),
}
DEFAULT_DIMS = (8, 16, 32, 64, 128, 256, 512, 1024)
# The additive score's tanh block and its neighbours (sum, tanh, product)
# live at once: bytes per element of the estimate.
_ADDITIVE_BYTES_PER_ELEMENT = 3 * 4
# `scores.additive` (the Transformer's) never holds more than this many
# elements of the block per head (it chunks the queries).
_CHUNKED_ADDITIVE_ELEMENTS = 2 ** 22


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything one run measures; the flags of the same names fill it."""

  dims: tuple[int, ...] = DEFAULT_DIMS
  batches: int = 4
  models: tuple[str, ...] = MODELS
  inits: tuple[str, ...] = INITS
  transformer_scores: tuple[str, ...] = DEFAULT_SCORES["transformer"]
  rnn_scores: tuple[str, ...] = DEFAULT_SCORES["rnn"]
  d_model: int = 128
  num_heads: int = 2  # the `transformer` preset's
  d_ff: int = 512
  encoder_layers: int = 2
  decoder_layers: int = 2
  dataset: str = "bible_en_es"
  vocab_size: int = 2000
  max_length: int = 32
  batch_size: int = 64
  data_seed: int = 0
  seed: int = 0
  premise_passes: int = 2
  max_block_gb: float = 4.0

  def __post_init__(self):
    for name in ("batches", "d_model", "num_heads", "d_ff", "encoder_layers",
                 "decoder_layers", "vocab_size", "max_length", "batch_size",
                 "premise_passes"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}.")
    if not self.dims or any(int(d) <= 0 for d in self.dims):
      raise ValueError(f"`dims` must be positive integers, got {self.dims!r}.")
    if len(set(self.dims)) != len(self.dims):
      raise ValueError(f"`dims` must not repeat a value, got {self.dims!r}.")
    if not self.max_block_gb > 0:
      raise ValueError(f"`max_block_gb` must be > 0, got {self.max_block_gb!r}.")
    if self.d_model % self.num_heads:
      raise ValueError(f"`d_model` ({self.d_model}) must be divisible by `num_heads` "
                       f"({self.num_heads}).")
    if self.dataset not in input_pipeline.NAMES:
      raise ValueError(f"`dataset` got {self.dataset!r}; allowed values: "
                       f"{', '.join(input_pipeline.NAMES)}.")
    for name, allowed in (("models", MODELS), ("inits", INITS)):
      values = getattr(self, name)
      if not values or any(v not in allowed for v in values):
        raise ValueError(f"`{name}` must name some of {allowed}, got {values!r}.")
    for score in self.transformer_scores:  # every MultiHeadAttention projects q and k
      registry.get(score, "transformer_scores")
    for score in self.rnn_scores:
      if not registry.get(score, "rnn_scores").projected:
        raise ValueError(
            f"`rnn_scores` got {score!r}, which has no query/key projection to measure; "
            f"use one of {[s for s in registry.SCORES if registry.SCORES[s].projected]}.")

  def scores(self, model: str) -> tuple[str, ...]:
    return getattr(self, f"{model}_scores")


# ----------------------------------------------------------------------------
# Models and batches.


def experiment_config(settings: Settings, model: str) -> config_lib.ExperimentConfig:
  """The quick preset's data settings with this run's model sizes: what
  the model config (`cfg.point(arm).model`) needs to build the model the
  trainer would build."""
  common = dict(dataset=settings.dataset, vocab_size=settings.vocab_size,
                max_length=settings.max_length, batch_size=settings.batch_size,
                data_seed=settings.data_seed, arms=settings.scores(model),
                dims=settings.dims, model=model)
  if model == "transformer":
    common.update(hidden_dim=settings.d_model, num_heads=settings.num_heads,
                  ff_dim=settings.d_ff, encoder_layers=settings.encoder_layers,
                  decoder_layers=settings.decoder_layers)
  return config_lib.from_preset("quick", **common)


def build_model(settings: Settings, model: str, score: str, dim: int, data) -> nnx.Module:
  """The model as the trainer initialises it (one seed, `settings.seed`)."""
  cfg = experiment_config(settings, model)
  arm = config_lib.Arm.of(score, dim)
  model_cls, model_config = cfg.point(arm).model.build(arm, data)
  return model_cls(model_config, rngs=nnx.Rngs(settings.seed))


def first_batches(data, settings: Settings) -> list[tuple[np.ndarray, np.ndarray]]:
  """The trainer's first `settings.batches` training batches as
  `(src [B, L], tgt_in [B, L])` (teacher-forced decoder input), all padded to
  the longest batch's length L so one compiled program serves them all
  (padding is masked everywhere: the valid positions' numbers do not change)."""
  tok = data.tokenizer
  stream = data.batches("train", settings.batch_size, seed=settings.data_seed,
                        shuffle=True, repeat=True, max_length=settings.max_length)
  pairs = []
  for _ in range(settings.batches):
    batch = next(stream)
    tgt = np.asarray(batch.tgt, np.int32)
    pairs.append((np.asarray(batch.src, np.int32),
                  steps.decoder_input(tgt, tok.sos_id, tok.pad_id)))
  length = max(max(src.shape[1], tgt_in.shape[1]) for src, tgt_in in pairs)
  pad = lambda x: np.pad(x, ((0, 0), (0, length - x.shape[1])), constant_values=tok.pad_id)
  return [(pad(src), pad(tgt_in)) for src, tgt_in in pairs]


# ----------------------------------------------------------------------------
# Where the logits come from: one `Site` per attention module.


@dataclasses.dataclass(frozen=True)
class Site:
  """One attention module's step-0 quantities on one batch.

  q `[B, T, C]`, k `[B, S, C]` (C = H·d_k for the Transformer: every head's
  components), scores / weights `[B, (H,) T, S]` float32, key_valid /
  query_valid bool broadcastable to the scores (key_valid carries the causal
  mask), q_valid `[B, T]`, k_valid `[B, S]`; reference_max_logit the largest
  logit of the module as the model itself reports it (the Transformer's
  `aux['max_logits']`), None where the model reports none.
  """
  q: jax.Array
  k: jax.Array
  scores: jax.Array
  weights: jax.Array
  key_valid: jax.Array
  query_valid: jax.Array
  q_valid: jax.Array
  k_valid: jax.Array
  reference_max_logit: jax.Array | None = None


# A pytree, so a jitted function can return the sites themselves.
jax.tree_util.register_dataclass(
    Site, data_fields=[f.name for f in dataclasses.fields(Site)], meta_fields=[])


# The Transformer's attention modules in the order the sites list them.
_TRANSFORMER_ORDER = (("encoder_layers", "self_attn"), ("decoder_layers", "self_attn"),
                      ("decoder_layers", "cross_attn"))


def attention_modules(model) -> list[tuple[str, int, Any]]:
  """`(kind, layer, attention module)` of every attention of `model`, in the
  order of its sites: the Transformer's `MultiHeadAttention`s (encoder self,
  decoder self, cross; layers in order), the RNN's one `Attention` (cross)."""
  if hasattr(model, "encoder_layers"):
    return [(ATTENTION_KINDS[(stack, sub)], layer, getattr(block, sub))
            for stack, sub in _TRANSFORMER_ORDER
            for layer, block in enumerate(getattr(model, stack))]
  return [("cross", 0, model.attention)]


def query_key_projections(module) -> tuple[nnx.Linear, nnx.Linear]:
  """The `nnx.Linear` pair that makes an attention module's queries and keys."""
  if hasattr(module, "query_proj"):  # layers.Attention (the RNN's)
    return module.query_proj, module.key_proj
  return module.query, module.key  # layers.MultiHeadAttention


def _merge_heads(x: jax.Array) -> jax.Array:
  """`[B, H, T, d]` -> `[B, T, H·d]`."""
  x = jnp.swapaxes(x, 1, 2)
  return x.reshape(x.shape[:2] + (-1,))


def _single_output(captured, where: str):
  """The one output a captured method produced (it must have run exactly once)."""
  outputs = captured.get_value()
  if len(outputs) != 1:
    raise RuntimeError(f"{where} ran {len(outputs)} times in one forward pass; expected once.")
  return outputs[0]


def transformer_sites(model, src, tgt_in) -> list[Site]:
  """Every attention module of a Transformer on one batch, in the order of
  `attention_modules`.

  One deterministic forward pass of `model(src, tgt_in, return_max_logits=True)`
  (which makes self attention return its weights) under `nnx.capture`,
  keeping what each `MultiHeadAttention` computed: its projected queries and
  keys, its raw `scores` and the softmax weights of `attend`. Each site also
  carries the model's own `aux['max_logits']` entry, against which the masks
  built here are checked (`batch_stats`).
  """
  pad = model.config.pad_id
  src, tgt_in = jnp.asarray(src), jnp.asarray(tgt_in)
  (_, aux), captured = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(
      src, tgt_in, return_max_logits=True)
  src_valid, tgt_valid = masks.padding(src, pad), masks.padding(tgt_in, pad)  # [B, S], [B, T]
  causal = masks.causal(tgt_in.shape[1])[None, None]  # [1, 1, T, T]
  valid = {  # kind -> (key_valid, query_valid, q_valid, k_valid)
      "encoder_self": (src_valid[:, None, None, :], src_valid[:, None, :, None],
                       src_valid, src_valid),
      "decoder_self": (causal & tgt_valid[:, None, None, :], tgt_valid[:, None, :, None],
                       tgt_valid, tgt_valid),
      "cross": (src_valid[:, None, None, :], tgt_valid[:, None, :, None],
                tgt_valid, src_valid),
  }
  stack_of = {kind: key for key, kind in ATTENTION_KINDS.items()}
  sites = []
  for kind, layer, _ in attention_modules(model):
    stack, sub = stack_of[kind]
    state = captured[stack][layer][sub]
    where = f"{stack}[{layer}].{sub}"
    q = _single_output(state["project_query"], where + ".project_query")
    k, _ = _single_output(state["project_kv"], where + ".project_kv")
    scores = _single_output(state["scores"], where + ".scores")
    _, attend_aux = _single_output(state["attend"], where + ".attend")
    sites.append(Site(_merge_heads(q), _merge_heads(k), scores, attend_aux["weights"],
                      *valid[kind], reference_max_logit=aux["max_logits"][kind][layer]))
  return sites


def rnn_sites(model, src, tgt_in) -> list[Site]:
  """The RNN's one attention module (the Luong decoder's, over the encoder)
  on one batch.

  A teacher-forced pass through the model's own decoding API
  (`init_decode`, then `decode_step` fed the gold `tgt_in`: what
  `Seq2Seq.__call__` runs) collects every step's top decoder state s_t, the
  query of the attention; the scores are the attention layer's own
  `scores(s, prepared keys)` for all steps at once, the weights those the
  model computed at each step.
  """
  cfg = model.config
  src, tgt_in = jnp.asarray(src), jnp.asarray(tgt_in)
  memory, carry = model.init_decode(src)

  def body(carry, xs):
    tokens, t = xs
    _, carry, weights = model.decode_step(memory, carry, tokens, t)
    top = carry["cells"][-1]
    state = top[1] if cfg.cell == "lstm" else top  # [B, h]
    return carry, (state, weights)

  positions = jnp.arange(tgt_in.shape[1])
  _, (states, weights) = jax.lax.scan(body, carry, (jnp.swapaxes(tgt_in, 0, 1), positions))
  states = jnp.swapaxes(states, 0, 1).astype(cfg.dtype)  # [B, T, h]
  attention = model.attention
  keys = memory["prepared"]  # [B, S, a]
  src_valid, tgt_valid = masks.padding(src, cfg.pad_id), masks.padding(tgt_in, cfg.pad_id)
  return [Site(attention.query_proj(states), keys, attention.scores(states, keys),
               jnp.swapaxes(weights, 0, 1), src_valid[:, None, :], tgt_valid[:, :, None],
               tgt_valid, src_valid)]


SITES: dict[str, Callable[..., list[Site]]] = {"transformer": transformer_sites,
                                               "rnn": rnn_sites}


# ----------------------------------------------------------------------------
# Measurements (pure functions of arrays; jit-safe).


def attention_stats(scores, weights, key_valid, query_valid) -> dict[str, jax.Array]:
  """`diagnostics.softmax_stats` (logit_std, entropy, saturated, max_logit)
  plus `max_abs_logit`, the largest |logit| at the same pairs; float32 scalars.

  Only query rows with at least two valid keys count: a row with one (the
  first position of causal self attention) has no choice to make, a weight
  of 1 that would count as saturated and a logit std of 0.
  """
  pairs = jnp.broadcast_to(key_valid & query_valid, scores.shape)
  choice = query_valid & (jnp.sum(pairs, axis=-1, keepdims=True) >= 2)
  stats = dict(diagnostics.softmax_stats(scores, weights, key_valid, choice))
  stats["max_abs_logit"] = jnp.max(
      jnp.where(pairs & choice, jnp.abs(scores.astype(jnp.float32)), -jnp.inf))
  return stats


def component_moments(x, valid) -> tuple[jax.Array, jax.Array]:
  """`(variance, mean square)` of the components of `x [B, N, C]` over the
  valid positions `valid [B, N]`: per component over positions, then averaged
  over the C components. The footnote's premise is variance 1 with mean 0."""
  x = jnp.asarray(x, jnp.float32)
  mask = jnp.asarray(valid)[..., None]  # [B, N, 1]
  count = jnp.maximum(jnp.sum(valid), 1)
  mean = jnp.sum(jnp.where(mask, x, 0.0), axis=(0, 1)) / count  # [C]
  var = jnp.sum(jnp.where(mask, jnp.square(x - mean), 0.0), axis=(0, 1)) / count
  square = jnp.sum(jnp.where(mask, jnp.square(x), 0.0), axis=(0, 1)) / count
  return jnp.mean(var), jnp.mean(square)


def site_stats(site: Site) -> dict[str, jax.Array]:
  """Every statistic of one attention module on one batch (float32 scalars);
  `reference_max_logit` too where the model reports it."""
  out = attention_stats(site.scores, site.weights, site.key_valid, site.query_valid)
  out["q_var"], out["q_mean_square"] = component_moments(site.q, site.q_valid)
  out["k_var"], out["k_mean_square"] = component_moments(site.k, site.k_valid)
  if site.reference_max_logit is not None:  # both only for the mask check
    out["reference_max_logit"] = site.reference_max_logit
    out["pairs_max_logit"] = jnp.max(jnp.where(site.key_valid & site.query_valid,
                                               site.scores, -jnp.inf))
  return out


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _compiled(fn, model_name: str, graphdef, state, src, tgt_in):
  return fn(model_name, nnx.merge(graphdef, state), src, tgt_in)


def compiled_sites(model_name: str, model, src, tgt_in) -> list[Site]:
  """`SITES[model_name](model, src, tgt_in)`, compiled (once per model
  structure and batch shape) instead of run op by op."""
  graphdef, state = nnx.split(model)
  return _compiled(_sites, model_name, graphdef, state, src, tgt_in)


def _sites(model_name, model, src, tgt_in):
  return SITES[model_name](model, src, tgt_in)


def _stats(model_name, model, src, tgt_in):
  return [site_stats(site) for site in SITES[model_name](model, src, tgt_in)]


def batch_stats(model_name: str, model, src, tgt_in) -> list[dict[str, float]]:
  """`site_stats` of every attention module of `model` on one batch, in the
  order of `attention_modules`, as floats; one compiled program per model
  structure and batch shape. Raises if a largest logit disagrees with the
  model's own report (the masks here would not be the model's)."""
  graphdef, state = nnx.split(model)
  out = []
  for i, stats in enumerate(_compiled(_stats, model_name, graphdef, state, src, tgt_in)):
    stats = {name: float(value) for name, value in stats.items()}
    reference = stats.pop("reference_max_logit", None)
    ours = stats.pop("pairs_max_logit", None)
    if reference is not None and not math.isclose(ours, reference, rel_tol=1e-5,
                                                  abs_tol=1e-6):
      raise RuntimeError(
          f"attention module {i} of the {model_name}: largest logit {ours} under the "
          f"masks here, {reference} in the model's aux['max_logits'].")
    out.append(stats)
  return out


def combine_batches(per_batch: list[dict[str, float]]) -> dict[str, float]:
  """Per-batch statistics of one module -> one row: the mean over batches,
  but the maximum for the largest logits."""
  if not per_batch:
    raise ValueError("`per_batch` must hold at least one batch's statistics.")
  out = {}
  for name in per_batch[0]:
    values = [b[name] for b in per_batch]
    out[name] = max(values) if name in ("max_logit", "max_abs_logit") else float(np.mean(values))
  return out


# ----------------------------------------------------------------------------
# The premise initialisation.


def apply_premise(model_name: str, model, src, tgt_in, key: jax.Array, passes: int) -> None:
  """Makes the footnote's premise true in place (module docstring): every
  attention module's query and key kernels become standard-normal draws with
  zero biases, then are divided, `passes` times, by the root mean square of
  their outputs on `(src, tgt_in)`."""
  projections = [query_key_projections(m) for _, _, m in attention_modules(model)]
  for i, proj in enumerate(p for pair in projections for p in pair):
    kernel = proj.kernel[...]
    proj.kernel[...] = jax.random.normal(jax.random.fold_in(key, i), kernel.shape, kernel.dtype)
    if proj.bias is not None:
      proj.bias[...] = jnp.zeros_like(proj.bias[...])
  for _ in range(passes):
    for (q_proj, k_proj), stats in zip(projections, batch_stats(model_name, model, src, tgt_in)):
      q_proj.kernel[...] = q_proj.kernel[...] / math.sqrt(stats["q_mean_square"])
      k_proj.kernel[...] = k_proj.kernel[...] / math.sqrt(stats["k_mean_square"])


def additive_block_bytes(settings: Settings, model: str, dim: int, length: int) -> int:
  """Estimated bytes of the additive score's tanh block at once: the RNN
  scores all T steps' queries at once (`[B, T, S, a]`); the Transformer's
  `scores.additive` chunks its queries (at most 2**22 elements per head)."""
  elements = settings.batch_size * length * length * dim
  if model == "transformer":
    elements = settings.num_heads * min(elements, _CHUNKED_ADDITIVE_ELEMENTS)
  return elements * _ADDITIVE_BYTES_PER_ELEMENT


# ----------------------------------------------------------------------------
# The run.


def measure(settings: Settings, data, *, log: Callable[[str], None] = print
            ) -> tuple[list[dict[str, Any]], list[str]]:
  """Every (model, init, score, d_k) of `settings` on the first batches of `data`.

  Returns:
    `(rows, skipped)`: one row per (model, init, score, dim, kind, layer) with
    `batches` (how many were averaged) and the statistics of `site_stats`;
    `skipped` says which configurations were left out and why.
  """
  batches = first_batches(data, settings)
  length = batches[0][0].shape[1]
  rows, skipped = [], []
  for model_name in settings.models:
    for score in settings.scores(model_name):
      for dim in settings.dims:
        if score == "additive":
          need = additive_block_bytes(settings, model_name, dim, length)
          if need > settings.max_block_gb * 2 ** 30:
            skipped.append(f"{model_name} additive d={dim}: its tanh block needs about "
                           f"{need / 2 ** 30:.1f} GB > --max_block_gb={settings.max_block_gb}")
            log("skipped " + skipped[-1])
            continue
        model = build_model(settings, model_name, score, dim, data)
        for init in INITS:  # default first: the premise then changes the model in place
          if init not in settings.inits:
            continue
          start = time.perf_counter()
          if init == "premise":
            apply_premise(model_name, model, *batches[0],
                          jax.random.key(settings.seed + 1), settings.premise_passes)
          per_batch = [batch_stats(model_name, model, src, tgt_in) for src, tgt_in in batches]
          for i, (kind, layer, _) in enumerate(attention_modules(model)):
            stats = combine_batches([b[i] for b in per_batch])
            rows.append(dict(model=model_name, init=init, score=score, dim=int(dim),
                             kind=kind, layer=layer, batches=len(per_batch), **stats))
          mean_std = np.mean([r["logit_std"] for r in rows[-len(per_batch[0]):]])
          log(f"{model_name} {init} {score} d={dim}: mean logit std {mean_std:.4g} "
              f"({time.perf_counter() - start:.1f} s)")
  return rows, skipped


# ----------------------------------------------------------------------------
# Fits, tables, plot, README.


def pooled(rows: list[dict], model: str, init: str, score: str, field: str,
           kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """`(dims, values)`: per d_k, the mean of `field` over the attention
  modules (of one `kind`, or of every kind) of one (model, init, score)."""
  by_dim: dict[int, list[float]] = {}
  for r in rows:
    if (r["model"], r["init"], r["score"]) == (model, init, score) and kind in (None, r["kind"]):
      by_dim.setdefault(r["dim"], []).append(r[field])
  dims = np.array(sorted(by_dim), dtype=np.float64)
  return dims, np.array([np.mean(by_dim[int(d)]) for d in dims])


def fit(rows: list[dict], model: str, init: str, score: str, field: str,
        kind: str | None = None) -> tuple[float, float, float] | None:
  """`scaling.loglog_slope` of the pooled `field` against d_k; None where
  fewer than 3 dims were measured or a value is not positive."""
  dims, values = pooled(rows, model, init, score, field, kind)
  if len(dims) < 3 or not np.all(values > 0):
    return None
  return scaling.loglog_slope(dims, values)


def _slope_text(result) -> str:
  if result is None:
    return "n/a"
  slope, lo, hi = result
  return f"{slope:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _groups(rows):
  """(model, init, score) in the order the rows were measured."""
  seen = []
  for r in rows:
    key = (r["model"], r["init"], r["score"])
    if key not in seen:
      seen.append(key)
  return seen


def summary(rows: list[dict]) -> list[dict[str, Any]]:
  """One entry per (model, init, score): the pooled slopes of logit std and
  max |logit| against d_k, the per-kind slopes of logit std, the pooled logit
  std at the smallest and largest d_k and at its peak (a single slope hides a
  rise-then-fall), and the saturated share at the largest d_k."""
  out = []
  for model, init, score in _groups(rows):
    dims, std = pooled(rows, model, init, score, "logit_std")
    _, sat = pooled(rows, model, init, score, "saturated")
    kinds = [k for k in KINDS if any(r["kind"] == k and r["model"] == model for r in rows)]
    out.append(dict(
        model=model, init=init, score=score, dims=[int(d) for d in dims],
        logit_std_slope=fit(rows, model, init, score, "logit_std"),
        max_abs_logit_slope=fit(rows, model, init, score, "max_abs_logit"),
        kind_slopes={k: fit(rows, model, init, score, "logit_std", k) for k in kinds},
        std_first=float(std[0]), std_last=float(std[-1]),
        std_peak=float(std.max()), dim_peak=int(dims[int(np.argmax(std))]),
        saturated_last=float(sat[-1])))
  return out


def table_markdown(rows: list[dict]) -> str:
  """`table.md`: the slopes per model / init / score, the per-kind slopes,
  and the measured query / key component variances per d_k."""
  entries = summary(rows)
  lines = ["Log-log least-squares slopes against d_k (95% interval, t with n - 2 dof). "
           "Pooled: per d_k the mean over attention kinds and layers, then the fit.", ""]
  for model in MODELS:
    mine = [e for e in entries if e["model"] == model]
    if not mine:
      continue
    dims = mine[0]["dims"]
    lines += [f"### {model}", "",
              f"| init | score | slope of logit std | slope of max \\|logit\\| | "
              f"logit std at d={dims[0]} | peak (at d) | logit std at d={dims[-1]} | "
              f"saturated rows at d={dims[-1]} |",
              "|---|---|---|---|---|---|---|---|"]
    for e in mine:
      lines.append(f"| {e['init']} | {e['score']} | {_slope_text(e['logit_std_slope'])} | "
                   f"{_slope_text(e['max_abs_logit_slope'])} | {e['std_first']:.3g} | "
                   f"{e['std_peak']:.3g} ({e['dim_peak']}) | {e['std_last']:.3g} | "
                   f"{100 * e['saturated_last']:.1f}% |")
    kinds = list(mine[0]["kind_slopes"])
    if len(kinds) > 1:
      lines += ["", "Slope of logit std per attention kind (mean over layers):", "",
                "| init | score | " + " | ".join(kinds) + " |",
                "|---|---|" + "---|" * len(kinds)]
      for e in mine:
        lines.append(f"| {e['init']} | {e['score']} | "
                     + " | ".join(_slope_text(e["kind_slopes"][k]) for k in kinds) + " |")
    lines += ["", "Query / key component variance at step 0 (mean over scores, kinds and "
              "layers; mean square in brackets where it differs by > 5%):", "",
              "| init | " + " | ".join(f"d={d}" for d in dims) + " |",
              "|---|" + "---|" * len(dims)]
    for init in INITS:
      cells = []
      for d in dims:
        sel = [r for r in rows if (r["model"], r["init"], r["dim"]) == (model, init, d)]
        if not sel:
          cells.append("n/a")
          continue
        moments = {f: float(np.mean([r[f] for r in sel]))
                   for f in ("q_var", "k_var", "q_mean_square", "k_mean_square")}
        cell = []
        for side in ("q", "k"):
          var, square = moments[f"{side}_var"], moments[f"{side}_mean_square"]
          text = f"{side} {var:.3g}"
          if abs(square - var) > 0.05 * var:
            text += f" ({square:.3g})"
          cell.append(text)
        cells.append(", ".join(cell))
      if any(c != "n/a" for c in cells):
        lines.append(f"| {init} | " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
  """`logit_std.png`: log-log pooled logit std against d_k, one panel per
  model (rows) x init (columns), a line per score, and a dotted √d_k guide
  through the unscaled score's first point."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  models = [m for m in MODELS if any(r["model"] == m for r in rows)]
  inits = [i for i in INITS if any(r["init"] == i for r in rows)]
  fig, axes = plt.subplots(len(models), len(inits), figsize=(5.0 * len(inits),
                                                            3.8 * len(models)),
                           squeeze=False)
  for (row, model), (col, init) in itertools.product(enumerate(models), enumerate(inits)):
    ax = axes[row][col]
    scores = [s for m, i, s in _groups(rows) if (m, i) == (model, init)]
    for score in scores:
      dims, std = pooled(rows, model, init, score, "logit_std")
      ax.plot(dims, std, marker="o", label=score)
      if score == UNSCALED[model]:
        ax.plot(dims, std[0] * np.sqrt(dims / dims[0]), ":", color="grey",
                label="∝ √d_k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"{model}, {init} init")
    ax.grid(True, which="both", alpha=0.3)
    if row == len(models) - 1:
      ax.set_xlabel("d_k (per-head query/key size; RNN: a)")
    if col == 0:
      ax.set_ylabel("logit std over keys (step 0)")
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def provenance(argv: list[str]) -> dict[str, Any]:
  """Commit (and whether the tree had changes), library versions, machine,
  its 1-minute load average when called (other jobs sharing the cores) and
  the command line that produced the results."""
  def git(*args):  # stdout as is: porcelain lines start with a status column
    try:
      return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                            ).stdout
    except (OSError, subprocess.CalledProcessError):
      return None

  status = git("status", "--porcelain")
  commit = git("rev-parse", "HEAD")
  machine = benchmarking.machine_description()
  return dict(
      commit=None if commit is None else commit.strip(),
      dirty=None if status is None else bool(status.strip()),
      changed_paths=None if status is None else [line[3:] for line in status.splitlines()],
      jax_version=jax.__version__, flax_version=flax.__version__,
      platform=f"{machine['platform']} ({platform.platform()})", cpu=machine["cpu"],
      cpu_cores=machine["cpu_cores"], load_average=round(os.getloadavg()[0], 2),
      niceness=os.nice(0),
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      command=" ".join(["python", "-m", "experiments.init_logits"]
                       + [shlex.quote(a) for a in argv[1:]]))


def _sign_words(result, expected: float | None = None) -> str:
  """Plain words for a slope with its interval (and how it stands against
  the `expected` exponent)."""
  if result is None:
    return "could not be fitted"
  slope, lo, hi = result
  text = f"d_k^{slope:+.2f} (95% interval {lo:+.2f} to {hi:+.2f})"
  if lo > 0:
    verdict = "grows with d_k"
  elif hi < 0:
    verdict = "falls as d_k grows"
  else:
    verdict = "shows no detectable trend with d_k"
  if expected is not None:
    miss = min(abs(expected - lo), abs(expected - hi))
    if lo <= expected <= hi:
      where = "inside the interval"
    elif miss < 0.01:
      where = "just outside the interval"
    else:
      where = f"{miss:.2f} outside the interval"
    verdict += f" (the footnote's {expected:+.1f} is {where})"
  return f"{verdict}: {text}"


def _query_fans(settings: Settings, model: str) -> tuple[int, int]:
  """(fan_in, heads) of a model's query projection: fan_out = heads · d_k."""
  if model == "transformer":
    return settings.d_model, settings.num_heads
  return experiment_config(settings, model).hidden_dim, 1  # the decoder state


def _default_paragraph(rows, entries, settings: Settings, model: str) -> str | None:
  unscaled, scaled = UNSCALED[model], SCALED[model]
  e = entries.get((model, "default", unscaled))
  if e is None:
    return None
  dims = e["dims"]
  sel = [r for r in rows if (r["model"], r["init"], r["score"]) == (model, "default", unscaled)]
  square = {d: np.mean([r["q_mean_square"] for r in sel if r["dim"] == d])
            for d in (dims[0], dims[-1])}
  fan_in, heads = _query_fans(settings, model)
  predicted = (fan_in + heads * dims[0]) / (fan_in + heads * dims[-1])
  shape = f"{e['std_first']:.3g} at d_k={dims[0]}"
  if dims[0] < e["dim_peak"] < dims[-1]:
    shape += f", a peak of {e['std_peak']:.3g} at d_k={e['dim_peak']}"
  text = (f"**{model}, default (Glorot) init.** The unscaled (`{unscaled}`) logit std "
          f"{_sign_words(e['logit_std_slope'])}; it is {shape} and {e['std_last']:.3g} at "
          f"d_k={dims[-1]}, with {100 * e['saturated_last']:.1f}% saturated rows there. "
          f"The premise does not hold: the query components' mean square goes from "
          f"{square[dims[0]]:.3g} to {square[dims[-1]]:.3g} (ratio "
          f"{square[dims[-1]] / square[dims[0]]:.3f}), where Glorot's variance "
          f"2 / (fan_in + fan_out), fan_in = {fan_in}, fan_out = {heads}·d_k, predicts "
          f"a ratio of {predicted:.3f}. The unscaled logit variance, about "
          f"d_k · E[q²] · E[k²], therefore grows like d_k only while fan_out << fan_in "
          f"and falls like 1/d_k beyond (fan_out = fan_in at d_k = {fan_in / heads:g}).")
  s = entries.get((model, "default", scaled))
  if s is not None:
    text += f" The scaled (`{scaled}`) logit std {_sign_words(s['logit_std_slope'])}."
  return text


def _premise_paragraph(entries, model: str) -> str | None:
  e = entries.get((model, "premise", UNSCALED[model]))
  if e is None:
    return None
  text = (f"**{model}, premise init** (q, k components with mean square 1). The unscaled "
          f"logit std {_sign_words(e['logit_std_slope'], 0.5)}, from {e['std_first']:.3g} "
          f"to {e['std_last']:.3g}, with {100 * e['saturated_last']:.1f}% saturated rows "
          f"at d_k={e['dims'][-1]}.")
  s = entries.get((model, "premise", SCALED[model]))
  if s is not None:
    text += (f" The scaled logit std {_sign_words(s['logit_std_slope'], 0.0)}, "
             f"{s['std_first']:.3g} to {s['std_last']:.3g}, "
             f"{100 * s['saturated_last']:.1f}% saturated rows.")
  return text


def _most_saturated(rows, model: str, init: str) -> str:
  """The largest share of saturated rows of a model's unscaled score over
  d_k (mean over its attention modules at each d_k), and where, in words."""
  dims, share = pooled(rows, model, init, UNSCALED[model], "saturated")
  i = int(np.argmax(share))
  where = f", d_k={int(dims[i])}" if share[i] > 0 else ""
  return f"{100 * share[i]:.1f}% ({model}{where})"


def conclusion(rows: list[dict], settings: Settings) -> str:
  """The README's conclusion, written from the measured numbers."""
  entries = {(e["model"], e["init"], e["score"]): e for e in summary(rows)}
  paragraphs = []
  for model in MODELS:
    paragraphs += [p for p in (_default_paragraph(rows, entries, settings, model),
                               _premise_paragraph(entries, model)) if p]
  slopes = {(m, i, s): entries[(m, i, s)]["logit_std_slope"]
            for m in MODELS for i in INITS for s in (UNSCALED[m], SCALED[m])
            if (m, i, s) in entries and entries[(m, i, s)]["logit_std_slope"]}
  default = {m: slopes[(m, "default", UNSCALED[m])] for m in MODELS
             if (m, "default", UNSCALED[m]) in slopes}
  if default:
    grows = [m for m, (_, _, hi) in default.items() if hi >= 0.5]
    listed = ", ".join(f"{m} {slope:+.2f} [{lo:+.2f}, {hi:+.2f}]"
                       for m, (slope, lo, hi) in default.items())
    text = ("**In short.** " + (
        "With the default initialisation the unscaled logits do not grow with d_k the "
        "way the footnote derives" if not grows else
        f"With the default initialisation the footnote's growth cannot be ruled out for "
        f"{', '.join(grows)}") + f": the fitted exponents are {listed}, against +0.5. ")
    text += "At step 0 the default models' unscaled softmax is saturated in at most " + (
        ", ".join(_most_saturated(rows, m, "default") for m in default)
        + " of the rows at any d_k. ")
    premise = [(m, slopes[(m, "premise", UNSCALED[m])]) for m in MODELS
               if (m, "premise", UNSCALED[m]) in slopes]
    if premise:
      text += ("Made true, the premise brings the footnote back: "
               + ", ".join(f"{m} {sl[0]:+.2f}" for m, sl in premise)
               + " unscaled (up to "
               + ", ".join(_most_saturated(rows, m, "premise") for m, _ in premise)
               + " of the rows saturated)")
      scaled = [(m, slopes[(m, "premise", SCALED[m])]) for m in MODELS
                if (m, "premise", SCALED[m]) in slopes]
      if scaled:
        text += ", " + ", ".join(f"{m} {sl[0]:+.2f}" for m, sl in scaled) + " scaled"
      text += "."
    paragraphs.append(text)
  return "\n\n".join(paragraphs)


def readme(rows: list[dict], skipped: list[str], prov: dict, settings: Settings,
           seconds: tuple[float, float]) -> str:
  """`README.md` of the output folder."""
  premise_text = __doc__.split("premise  ", 1)[1].split("\n\nPer (model", 1)[0]
  premise_text = " ".join(line.strip() for line in premise_text.splitlines())
  dirty = ""
  if prov["dirty"]:
    dirty = (" with uncommitted changes to "
             + ", ".join(f"`{p}`" for p in prov["changed_paths"]))
  env = f"XLA_FLAGS={shlex.quote(prov['xla_flags'])} " if prov["xla_flags"] else ""
  if prov["niceness"]:
    env += f"nice -n {prov['niceness']} "
  rnn = experiment_config(settings, "rnn")
  load = f"the machine's load average was {prov['load_average']} at the start"
  if prov["load_average"] > 1.0:
    load += ": other jobs shared its cores"
  skipped_text = ("\n".join(f"- {s}" for s in skipped) if skipped else
                  f"None: every configuration fitted in --max_block_gb={settings.max_block_gb}.")
  return f"""# Attention logits at initialisation: the footnote at step 0

## Question

Vaswani et al. (2017, footnote 4) justify the 1/√d_k of scaled dot-product
attention: if the components of q and k are independent with mean 0 and
variance 1, q·k has variance d_k, so large d_k pushes the softmax into regions
of tiny gradients. Does that happen in this repository's models **at step 0**,
with their default (Glorot/Xavier-uniform) initialisation, on real batches of
the corpus? And what happens when the premise is made true?

## Command

    {env}{prov['command']}

Wall time {seconds[0] / 60:.1f} min, CPU time {seconds[1] / 60:.1f} min, from loading the data
to writing these files ({load}).

Machine: {prov['cpu']}, {prov['cpu_cores']} cores, {prov['platform']};
JAX {prov['jax_version']}, Flax {prov['flax_version']}; commit `{prov['commit']}`{dirty}.

Data: `{settings.dataset}`, vocabulary {settings.vocab_size}, max length {settings.max_length},
the trainer's first {settings.batches} training batches of {settings.batch_size} (data seed
{settings.data_seed}), padded to one length (padding is masked everywhere); model seed
{settings.seed}; {settings.premise_passes} premise passes; d_k in {list(settings.dims)}.
Transformer: d_model {settings.d_model}, {settings.num_heads} heads, d_ff {settings.d_ff},
{settings.encoder_layers} encoder + {settings.decoder_layers} decoder layers (post-LN). RNN:
the quick preset's Seq2Seq (embeddings {rnn.embed_dim}, {rnn.encoder_layers} bidirectional
{rnn.cell.upper()} encoder layer(s) {rnn.hidden_dim}, {rnn.decoder_layers} {rnn.cell.upper()}
decoder layer(s) {rnn.hidden_dim}, Luong decoder).

## The two initialisations

- **default**: the model exactly as `cfg.point(arm).model.build` makes it and the
  trainer initialises it: every projection Glorot/Xavier uniform
  (`layers.GLOROT`, variance 2 / (fan_in + fan_out)), zero biases.
- **premise**: {premise_text}

Statistics (per model, init, score, d_k, attention kind and layer; averaged
over the batches, maxima maximised): logit std across the valid keys of a row
averaged over valid rows (`diagnostics.softmax_stats`), the largest |logit| at
a valid pair, the share of rows whose largest weight exceeds
{diagnostics.SATURATION}, the normalised entropy, and the variance and mean
square of the query and key components. Masks: source and target padding,
causal for decoder self attention (checked against the Transformer's own
`aux['max_logits']` on every batch); rows with a single valid key (the first
row of causal self attention: no choice to make) are left out. The logits are
the models' own (the Transformer's captured from its forward pass, the RNN's
from its attention layer on the decoder states of a teacher-forced pass).

Skipped: {skipped_text}

## Results

![logit std against d_k](logit_std.png)

{table_markdown(rows)}
## Conclusion

{conclusion(rows, settings)}

## Files

- `results.jsonl`: one row per (model, init, score, d_k, kind, layer) with every
  statistic and the provenance above.
- `table.md`: the tables above.
- `logit_std.png`: the figure above.
"""


def write_outputs(out_dir: str, rows: list[dict], skipped: list[str], prov: dict,
                  settings: Settings, seconds: tuple[float, float]) -> None:
  """`results.jsonl`, `table.md`, `logit_std.png` and `README.md` in `out_dir`;
  `seconds` is the run's (wall, CPU) time."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.jsonl"), "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps({**row, **prov}) + "\n")
  with open(os.path.join(out_dir, "table.md"), "w", encoding="utf-8") as f:
    f.write(table_markdown(rows))
  plot(rows, os.path.join(out_dir, "logit_std.png"))
  with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
    f.write(readme(rows, skipped, prov, settings, seconds))


# ----------------------------------------------------------------------------
# Command line.

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined only when this module is the program, since
  drivers that tests import beside it define `--dims`, `--models`, `--out` too."""
  defaults = Settings()
  flags.DEFINE_string("out", None, f"Output folder (created; default {SCRATCH_OUT}, a scratch "
                      "folder: the committed results/init_logits is written only when named).")
  flags.DEFINE_list("dims", [str(dim) for dim in defaults.dims],
                    "Per-head query/key sizes d_k (RNN: attention dimension a).")
  flags.DEFINE_integer("batches", defaults.batches, "Training batches averaged per configuration.")
  flags.DEFINE_list("models", list(defaults.models), "Models to measure: transformer, rnn.")
  flags.DEFINE_list("inits", list(defaults.inits), "Initialisations: default, premise.")
  flags.DEFINE_list("transformer_scores", list(defaults.transformer_scores), "Transformer scores.")
  flags.DEFINE_list("rnn_scores", list(defaults.rnn_scores), "RNN scores.")
  flags.DEFINE_integer("d_model", defaults.d_model, "Transformer d_model.")
  flags.DEFINE_integer("num_heads", defaults.num_heads, "Transformer heads.")
  flags.DEFINE_integer("d_ff", defaults.d_ff, "Transformer feed-forward width.")
  flags.DEFINE_integer("encoder_layers", defaults.encoder_layers, "Transformer encoder layers.")
  flags.DEFINE_integer("decoder_layers", defaults.decoder_layers, "Transformer decoder layers.")
  flags.DEFINE_string("dataset", defaults.dataset, "Dataset name (input_pipeline.load).")
  flags.DEFINE_integer("vocab_size", defaults.vocab_size, "SentencePiece vocabulary.")
  flags.DEFINE_integer("max_length", defaults.max_length, "Longest training pair (tokens).")
  flags.DEFINE_integer("batch_size", defaults.batch_size, "Sentences per batch.")
  flags.DEFINE_integer("data_seed", defaults.data_seed, "Shuffling seed of the training stream.")
  flags.DEFINE_integer("seed", defaults.seed, "Model initialisation seedefaults.")
  flags.DEFINE_integer("premise_passes", defaults.premise_passes,
                       "Measure-and-rescale passes of the premise initialisation.")
  flags.DEFINE_float("max_block_gb", defaults.max_block_gb,
                     "Skip additive configurations whose tanh block would exceed this.")


# Where a run without `--out` writes: a toy run with a flag or two must not
# replace the committed results/init_logits (it did, by default).
SCRATCH_OUT = os.path.join("runs", "init_logits")


def _dims(values: list[str]) -> tuple[int, ...]:
  try:
    return tuple(int(d) for d in values)
  except ValueError:
    raise ValueError(f"`dims` must be a comma-separated list of integers, got "
                     f"{','.join(values)!r}.") from None


def settings_from_flags() -> Settings:
  """The flags as `Settings`; a ValueError names the bad flag."""
  return Settings(
      dims=_dims(FLAGS.dims), batches=FLAGS.batches,
      models=tuple(FLAGS.models), inits=tuple(FLAGS.inits),
      transformer_scores=tuple(FLAGS.transformer_scores), rnn_scores=tuple(FLAGS.rnn_scores),
      d_model=FLAGS.d_model, num_heads=FLAGS.num_heads, d_ff=FLAGS.d_ff,
      encoder_layers=FLAGS.encoder_layers, decoder_layers=FLAGS.decoder_layers,
      dataset=FLAGS.dataset, vocab_size=FLAGS.vocab_size, max_length=FLAGS.max_length,
      batch_size=FLAGS.batch_size, data_seed=FLAGS.data_seed, seed=FLAGS.seed,
      premise_passes=FLAGS.premise_passes, max_block_gb=FLAGS.max_block_gb)


def load_data(settings: Settings):
  return datasets.load(settings.dataset, max_length=settings.max_length,
                       vocab_size=settings.vocab_size)


def checked_out(out: str | None) -> str:
  """The output folder: `out`, or `SCRATCH_OUT` when none is given; a
  ValueError naming `--out` unless it is (or can become) a writable folder,
  checked before minutes of measuring that a file there would throw away."""
  out = out or SCRATCH_OUT
  common.check_output_dir("out", out)
  return out


def main(argv):
  # One `error:` line for a bad flag, not absl's usage of every flag.
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  try:
    settings = settings_from_flags()
    for model in settings.models:  # everything the sweep's config refuses, too
      experiment_config(settings, model)
    out = checked_out(FLAGS.out)
  except ValueError as err:
    sys.exit(f"error: {err}")
  if not FLAGS.out:
    print(f"no --out given: writing to {out} (the committed results/init_logits is "
          "written only when --out names it)")
  prov = provenance(sys.argv)
  wall, cpu = time.perf_counter(), time.process_time()
  rows, skipped = measure(settings, load_data(settings))
  write_outputs(out, rows, skipped, prov, settings,
                (time.perf_counter() - wall, time.process_time() - cpu))
  print(f"wrote {out}/README.md ({len(rows)} rows)")


if __name__ == "__main__":
  define_flags()
  app.run(main)
