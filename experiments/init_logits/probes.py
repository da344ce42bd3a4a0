"""What the attention modules of a model compute at step 0: queries, keys, logits, weights.

One `Site` per attention module on one batch: its projected queries and keys,
raw logits and softmax weights, and the masks that say which (query, key)
pairs are valid. The logits are the model's own: the Transformer's are
captured from its forward pass (`nnx.capture` of `MultiHeadAttention`'s
methods), the RNN's from its attention layer's `scores` on the decoder states
of a teacher-forced pass through the model's decoding API. The statistics of
a site (`site_stats`) are pure jit-safe functions of its arrays; `batch_stats`
compiles them once per model structure and batch shape.

`apply_premise` makes the premise of Vaswani et al.'s footnote 4 true in a
model: query and key components of mean 0 and mean square 1 at step 0
(experiments/init_logits/run.py says how and why).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import masks
from attention_jax.models.transformer import ATTENTION_KINDS
from attention_jax.training import diagnostics


@dataclasses.dataclass(frozen=True)
class Site:
  """One attention module's step-0 quantities on one batch.

  q `[B, T, C]`, k `[B, S, C]` (C = H·d_k for the Transformer: every head's
  components), scores / weights `[B, (H,) T, S]` float32, key_valid /
  query_valid bool broadcastable to the scores (key_valid carries the causal
  mask), q_valid `[B, T]`, k_valid `[B, S]`; reference_max_logit the largest
  logit of the module as the model's own diagnostics report it (the
  Transformer's `diagnostics.max_logits`), None where they report none.
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

  One deterministic forward pass of a view of `model` whose attention
  modules sow their scores and weights (`diagnostics.transformer_attention`)
  under `nnx.capture`, keeping what each `MultiHeadAttention` computed: its
  projected queries and keys, its raw `scores` and the softmax weights it
  sowed. Each site also carries the model's own diagnostics' largest logit
  (`diagnostics.max_logits`), against which the masks built here are checked
  (`batch_stats`).
  """
  pad = model.config.pad_id
  src, tgt_in = jnp.asarray(src), jnp.asarray(tgt_in)
  _, captured = nnx.capture(nnx.view(model, sow_attention=True), nnx.Intermediate,
                            method_outputs=nnx.Intermediate)(src, tgt_in)
  reference = diagnostics.max_logits(diagnostics.sown_attention(model, captured, src, tgt_in))
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
    sown = _single_output(state["attention"], where + " sowing its attention")
    sites.append(Site(_merge_heads(q), _merge_heads(k), scores, sown["weights"],
                      *valid[kind], reference_max_logit=reference[kind][layer]))
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
          f"masks here, {reference} in the model's diagnostics.")
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



def apply_premise(model_name: str, model, src, tgt_in, key: jax.Array, passes: int) -> None:
  """Makes the footnote's premise true in place (experiments/init_logits/run.py): every
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
