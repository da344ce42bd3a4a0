"""Flax NNX attention layers built on the pure functions of `attention_jax`.

Two layers, both with the score function chosen by name (`SCORES`):

- `Attention`: single-head attention for RNN decoders (docs/formulas.md §2), query =
  decoder state, keys = values = encoder states, with the score's parameters
  and a `prepare` step that projects the keys once per source sentence, so a
  decoder `lax.scan` does only the query-side work at every step.
- `MultiHeadAttention`: the Transformer's multi-head attention (docs/formulas.md §4)
  with any score applied per head, masks, dropout on the weights, bfloat16
  compute with float32 parameters, an autoregressive key/value cache and the
  attention weights returned on request.

Score names and formulas: `registry.SCORES` (Britz et al. 2017 eq. 6-7,
Luong et al. 2015, Vaswani et al. 2017).

In `MultiHeadAttention` the per-head query/key projections W^Q_i, W^K_i (with
bias) *are* the W_1, W_2 of the multiplicative score, so `multiplicative` runs
as `dot` on the projected heads and `scaled_multiplicative` as `scaled_dot`
(a = the per-head query/key size), `inverse_dim` divides by a instead, and
`qk_norm` normalises them and multiplies by one learned g per layer.
`additive`, `general`, `cosine` and `location` add their own per-head
parameters on top of the head projections.

Shape glossary: B batch, H heads, T / Tq query length, S / Tk key length,
D model width, dq / dk query / key features, dv value features, a attention
(projection) dimension, L cache length.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.attention import attend, attention, compute_scores, select_implementation
from attention_jax import registry
from attention_jax import scores as scores_lib

__all__ = ["SCORES", "GLOROT", "check_score", "Attention", "MultiHeadAttention", "dropout_key",
           "beams_as_queries"]

SCORES = registry.LAYER_SCORES

# Glorot/Xavier uniform: the initialiser of every projection in the library.
GLOROT = nnx.initializers.xavier_uniform()


def check_score(score: str, field: str = "score") -> str:
  """Raises a ValueError naming `field` unless `score` is in `SCORES`."""
  return registry.get(score, field).name


def dropout_key(rngs) -> jax.Array | None:
  """One dropout key from an `nnx.Rngs` (its 'dropout' stream), an
  `nnx.RngStream` or a key array; None stays None."""
  if rngs is None:
    return None
  if isinstance(rngs, nnx.Rngs):
    return rngs.dropout()
  if isinstance(rngs, nnx.RngStream):
    return rngs()
  if isinstance(rngs, jax.Array):
    return rngs
  raise TypeError(
      f"`rngs` must be an nnx.Rngs with a 'dropout' stream, an nnx.RngStream or "
      f"a jax key array, got {type(rngs).__name__}.")


def _param(init, key, shape, dtype):
  return nnx.Param(init(key, shape, dtype))


# The additive score's `[B, Tq, S, a]` tanh block, recomputed in the backward
# pass instead of stored: inside the RNN decoder's `lax.scan` a stored block
# is stacked over all T steps (`[T, B, 1, S, a]`, 537 MB per step at B = 64,
# T = S = 32, a = 1024), and zero-filling and re-reading that buffer cost more
# than the recomputed tanh on 2 CPU cores (measured with a jax.profiler trace of the quick model).
_additive_rematerialised = jax.checkpoint(scores_lib.additive_projected)


def _check_offset(score_offset, shape, where: str):
  if score_offset is None:
    return None
  score_offset = jnp.asarray(score_offset)
  if tuple(score_offset.shape) != tuple(shape):
    raise ValueError(
        f"`score_offset` must have the scores' shape {tuple(shape)} ({where}), "
        f"got {tuple(score_offset.shape)}.")
  return score_offset.astype(jnp.float32)


class Attention(nnx.Module):
  """Single-head attention of an RNN decoder over the encoder states.

  Usage inside a decoder loop (keys projected once, outside the loop)::

    prepared = attn.prepare(encoder_states)          # once per sentence
    context, weights, scores = attn(query, prepared, encoder_states, mask=valid)

  Parameters per score (a = `attention_dim`, dq / dk query / key sizes):
  `additive` Linear(dq→a) + Linear(dk→a) (with bias, Glorot) + `v [a]`;
  `multiplicative`, `scaled_multiplicative` the same two Linears;
  `qk_norm` the same two Linears + scalar `g` (init log₂(L² − L), L =
  `max_source_length`); `inverse_dim` the two Linears;
  `general` `w [dq, dk]` (Glorot); `cosine` scalar `beta` (init √dk);
  `location` Linear(dq→max_source_length); `dot`, `scaled_dot` none.
  """

  def __init__(self, query_dim: int, key_dim: int, *, score: str = "additive",
               attention_dim: int | None = None,
               max_source_length: int | None = None,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    spec = registry.get(score)
    if spec.same_dim and query_dim != key_dim:
      raise ValueError(
          f"score {score!r} compares query and key directly and needs "
          f"query_dim == key_dim, got {query_dim} and {key_dim}; use "
          "'multiplicative' / 'general' or equal sizes.")
    if spec.needs_length and not max_source_length:
      raise ValueError(f"score {score!r} needs `max_source_length` (> 0).")
    self.score = score
    self.query_dim, self.key_dim = query_dim, key_dim
    self.attention_dim = attention_dim or key_dim
    self.max_source_length = max_source_length
    self.dtype = dtype
    a = self.attention_dim
    linear = dict(use_bias=True, kernel_init=GLOROT, dtype=dtype,
                  param_dtype=param_dtype, rngs=rngs)
    if spec.projected:
      self.query_proj = nnx.Linear(query_dim, a, **linear)
      self.key_proj = nnx.Linear(key_dim, a, **linear)
    if score == "additive":
      # Var(vᵀx) = Var(x) for unit-variance x: the score starts at unit scale.
      self.v = _param(nnx.initializers.normal(a ** -0.5), rngs.params(), (a,),
                      param_dtype)
    elif score == "general":
      self.w = _param(GLOROT, rngs.params(), (query_dim, key_dim), param_dtype)
    elif score == "cosine":
      # Cosines of random vectors have std 1/√d: β = √d gives unit-scale scores.
      self.beta = nnx.Param(jnp.full((), math.sqrt(key_dim), param_dtype))
    elif score == "location":
      self.location_proj = nnx.Linear(query_dim, max_source_length, **linear)
    elif score == "qk_norm":  # Henry et al. 2020: g₀ = log₂(L² − L)
      self.g = nnx.Param(jnp.full((), scores_lib.qk_norm_init(max_source_length),
                                  param_dtype))

  @property
  def projected(self) -> bool:
    """Whether the score projects query and key to `a` features (the registry's word)."""
    return registry.SCORES[self.score].projected

  def prepare(self, keys: jax.Array) -> jax.Array:
    """Key-side work done once per sentence: `[B, S, dk]` -> `[B, S, a]`
    (projected keys) for additive / multiplicative scores, else `keys` as is."""
    if self.projected:
      return self.key_proj(keys)  # [B, S, a]
    return keys

  def scores(self, query: jax.Array, prepared: jax.Array) -> jax.Array:
    """Raw scores, float32: query `[B, Tq, dq]`, prepared keys `[B, S, ·]`
    -> `[B, Tq, S]`."""
    s = self.score
    src_len = prepared.shape[-2]
    if s == "additive":
      q_proj = self.query_proj(query)  # [B, Tq, a]
      # The keys are projected once (`prepare`), outside the decoder's scan;
      # `scores.additive` would redo that projection at every step. With one
      # query per step the tanh block is only [B, 1, S, a], so the chunking
      # `scores.additive` offers for long query axes is not needed here.
      out = _additive_rematerialised(q_proj, prepared.astype(q_proj.dtype),
                                     self.v[...].astype(q_proj.dtype))  # [B, Tq, S]
    elif self.projected:  # (scaled_)multiplicative, qk_norm, inverse_dim
      q_proj = self.query_proj(query)  # [B, Tq, a]
      fn = getattr(scores_lib, registry.SCORES[s].on_projected)
      extra = (self.g[...].astype(q_proj.dtype),) if s == "qk_norm" else ()
      out = fn(q_proj, prepared.astype(q_proj.dtype), *extra)  # [B, Tq, S]
    elif s == "location":
      if src_len > self.max_source_length:
        raise ValueError(
            f"score 'location' was built for max_source_length="
            f"{self.max_source_length}, got a source of length {src_len}.")
      out = self.location_proj(query)[..., :src_len]  # [B, Tq, S]
    else:
      dtype = self.dtype or jnp.result_type(query, prepared)
      params = {}
      if s == "general":
        params["w"] = self.w[...].astype(dtype)
      elif s == "cosine":
        params["beta"] = self.beta[...].astype(dtype)
      out = compute_scores(
          s, query.astype(dtype), prepared.astype(dtype), params)  # [B, Tq, S]
    return out.astype(jnp.float32)

  def __call__(self, query: jax.Array, prepared: jax.Array, values: jax.Array, *,
               mask: jax.Array | None = None,
               score_offset: jax.Array | None = None):
    """Attention of `query [B, Tq, dq]` over `values [B, S, dv]`.

    Args:
      query: decoder states `[B, Tq, dq]`.
      prepared: `self.prepare(keys)`, `[B, S, ·]`.
      values: `[B, S, dv]` (the encoder states).
      mask: bool broadcastable to `[B, Tq, S]`, True = may attend.
      score_offset: float `[B, Tq, S]` added to the raw scores before the
        softmax (for gradients with respect to the logits).

    Returns:
      `(context [B, Tq, dv]` in values' dtype, `weights [B, Tq, S]` float32,
      `scores [B, Tq, S]` float32, raw: before offset and mask`)`.
    """
    raw = self.scores(query, prepared)  # [B, Tq, S]
    logits = raw
    offset = _check_offset(score_offset, raw.shape, "Attention")
    if offset is not None:
      logits = logits + offset
    context, weights = attend(logits, values, mask)
    return context, weights, raw


class MultiHeadAttention(nnx.Module):
  """Multi-head attention `Concat(head_1..head_h) W^O` with any score per head.

  `head_i = Attention_score(x_q W^Q_i, x_kv W^K_i, x_kv W^V_i)`; the Q, K, V
  projections are one `D x H·d` Linear each (with bias, Glorot), computed for
  all heads at once.

  The per-step decoding API keeps its cache as a plain pytree so it can ride
  in a `lax.while_loop` carry: `init_cache`, then `decode_step` appends one
  step's keys / values at a (traced) position and attends over the prefix.
  """

  def __init__(self, num_heads: int, in_features: int, *,
               kv_features: int | None = None, qk_features: int | None = None,
               v_features: int | None = None, out_features: int | None = None,
               score: str = "scaled_dot", dropout_rate: float = 0.0,
               max_length: int | None = None, use_bias: bool = True,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    """Args:
      num_heads: H.
      in_features: D, the query input width.
      kv_features: width of the key/value input (default D).
      qk_features: per-head query/key size d_k (default D / H; D % H must be 0).
      v_features: per-head value size d_v (default D / H).
      out_features: output width (default D).
      score: a name from `SCORES`.
      dropout_rate: dropout on the attention weights.
      max_length: longest key axis; required by `location`.
      use_bias: bias in the Q, K, V and output projections.
      dtype / param_dtype: compute / parameter dtypes.
      rngs: parameter initialisation.
    """
    spec = registry.get(score)
    if num_heads <= 0 or in_features <= 0:
      raise ValueError(
          f"`num_heads` and `in_features` must be > 0, got {num_heads}, {in_features}.")
    if (qk_features is None or v_features is None) and in_features % num_heads:
      raise ValueError(
          f"`in_features` (d_model) {in_features} must be divisible by "
          f"`num_heads` {num_heads} (d_k = d_v = d_model / h).")
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"`dropout_rate` must be in [0, 1), got {dropout_rate}.")
    if spec.needs_length and not max_length:
      raise ValueError(f"score {score!r} needs `max_length` (> 0).")
    self.num_heads = num_heads
    self.qk_features = qk_features or in_features // num_heads
    self.v_features = v_features or in_features // num_heads
    self.score = score
    self.dropout_rate = dropout_rate
    self.max_length = max_length
    self.dtype = dtype
    kv_features = kv_features or in_features
    out_features = out_features or in_features
    h, dk, dv = num_heads, self.qk_features, self.v_features
    linear = dict(use_bias=use_bias, kernel_init=GLOROT, dtype=dtype,
                  param_dtype=param_dtype, rngs=rngs)
    self.query = nnx.Linear(in_features, h * dk, **linear)
    self.key = nnx.Linear(kv_features, h * dk, **linear)
    self.value = nnx.Linear(kv_features, h * dv, **linear)
    self.out = nnx.Linear(h * dv, out_features, **linear)
    key = rngs.params
    if score == "additive":
      self.w_q = _param(GLOROT, key(), (h, dk, dk), param_dtype)
      self.w_k = _param(GLOROT, key(), (h, dk, dk), param_dtype)
      self.v = _param(nnx.initializers.normal(dk ** -0.5), key(), (h, dk), param_dtype)
    elif score == "general":
      self.w = _param(GLOROT, key(), (h, dk, dk), param_dtype)
    elif score == "cosine":
      self.beta = nnx.Param(jnp.full((h,), math.sqrt(dk), param_dtype))
    elif score == "location":
      self.w_loc = _param(GLOROT, key(), (h, dk, max_length), param_dtype)
      self.b_loc = nnx.Param(jnp.zeros((h, max_length), param_dtype))
    elif score == "qk_norm":  # one g per layer, shared by the heads (Henry et al. 2020)
      self.g = nnx.Param(jnp.full((), scores_lib.qk_norm_init(max_length), param_dtype))
    self.dropout = nnx.Dropout(dropout_rate)

  # -- projections -----------------------------------------------------------

  def _split(self, x, size):  # [B, T, H·d] -> [B, H, T, d]
    x = x.reshape(x.shape[:-1] + (self.num_heads, size))
    return jnp.swapaxes(x, -2, -3)

  def project_query(self, inputs_q: jax.Array) -> jax.Array:
    """`[B, T, D]` -> per-head queries `[B, H, T, d_k]`."""
    return self._split(self.query(inputs_q), self.qk_features)

  def project_kv(self, inputs_kv: jax.Array):
    """`[B, S, D_kv]` -> per-head `(keys [B, H, S, d_k], values [B, H, S, d_v])`."""
    return (self._split(self.key(inputs_kv), self.qk_features),
            self._split(self.value(inputs_kv), self.v_features))

  # -- scores and attention --------------------------------------------------

  def scores(self, q: jax.Array, k: jax.Array) -> jax.Array:
    """Raw per-head scores, float32: q `[B, H, T, d_k]`, k `[B, H, S, d_k]`
    -> `[B, H, T, S]`."""
    s = self.score
    dtype = self.dtype or jnp.result_type(q, k)
    if dtype == jnp.float16:  # as `attention`: float16 scores beyond 65504 would be inf
      dtype = jnp.float32
    q, k = q.astype(dtype), k.astype(dtype)
    per_head = lambda name: getattr(self, name)[...].astype(dtype)
    fused = registry.SCORES[s].fused
    if fused:  # dot, scaled_dot; (scaled_)multiplicative on the projected heads
      out = getattr(scores_lib, fused)(q, k)
    elif s == "inverse_dim":
      out = scores_lib.inverse_dim(q, k)
    elif s == "qk_norm":
      out = scores_lib.qk_norm(q, k, self.g[...].astype(dtype))
    elif s == "general":
      out = jax.vmap(scores_lib.general, in_axes=(1, 1, 0), out_axes=1)(
          q, k, per_head("w"))
    elif s == "additive":
      # vmap over heads: each head has its own W_1, W_2, v; `scores.additive`
      # chunks the [B, T, S, a] tanh block when it is large.
      out = jax.vmap(scores_lib.additive, in_axes=(1, 1, 0, 0, 0), out_axes=1)(
          q, k, per_head("w_q"), per_head("w_k"), per_head("v"))
    elif s == "cosine":
      out = scores_lib.cosine(q, k, per_head("beta")[:, None, None])
    else:  # location
      src_len = k.shape[-2]
      if src_len > self.max_length:
        raise ValueError(
            f"score 'location' was built for max_length={self.max_length}, "
            f"got {src_len} keys.")
      out = (jnp.einsum("bhtd,hdl->bhtl", q, per_head("w_loc"))
             + per_head("b_loc")[:, None, :])[..., :src_len]
    return out.astype(jnp.float32)  # [B, H, T, S]

  def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, *,
             mask: jax.Array | None = None, deterministic: bool = True,
             dropout_key: jax.Array | None = None,
             score_offset: jax.Array | None = None,
             return_weights: bool = False):
    """Attention over already projected heads, then the output projection.

    Args:
      q: `[B, H, T, d_k]`; k: `[B, H, S, d_k]`; v: `[B, H, S, d_v]`.
      mask: bool broadcastable to `[B, H, T, S]`; True = may attend.
      deterministic: False applies dropout to the weights (needs `dropout_key`).
      dropout_key: a jax key.
      score_offset: float `[B, H, T, S]` added to the raw scores.
      return_weights: return `aux = {'scores', 'weights'}`, both
        `[B, H, T, S]` float32 (scores raw: before offset and mask; weights
        before dropout); otherwise aux is None.

    Returns:
      `(out [B, T, D_out], aux)`.
    """
    use_dropout = not deterministic and self.dropout_rate > 0.0
    if use_dropout and dropout_key is None:
      raise ValueError("deterministic=False with dropout needs `rngs` / a dropout key.")
    # The pure score of the projected heads (None: per-head score parameters,
    # computed here); dropout on the weights and offsets need the plain path.
    pure = registry.SCORES[self.score].fused
    kernel = "plain" if pure is None else select_implementation(
        pure, "auto", q, k, v,
        return_weights=return_weights or use_dropout or score_offset is not None)
    if kernel != "plain":  # blockwise or fused (cuDNN flash attention on GPUs)
      dtype = self.dtype or jnp.result_type(q, k, v)
      context = attention(
          q.astype(dtype), k.astype(dtype), v.astype(dtype), score=pure,
          mask=mask, implementation="auto")  # [B, H, T, d_v]
      aux = None
    else:
      raw = self.scores(q, k)  # [B, H, T, S]
      offset = _check_offset(score_offset, raw.shape, "MultiHeadAttention")
      logits = raw if offset is None else raw + offset
      v = v.astype(self.dtype or v.dtype)
      context, weights = attend(logits, v, mask)  # [B,H,T,dv], [B,H,T,S]
      if use_dropout:
        dropped = self.dropout(weights, deterministic=False, rngs=dropout_key)
        context = jnp.matmul(dropped.astype(v.dtype), v,
                             preferred_element_type=jnp.float32).astype(v.dtype)
      aux = {"scores": raw, "weights": weights} if return_weights else None
    return self.out(_merge_heads(context)), aux  # [B, T, D_out]

  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array | None = None, *,
               mask: jax.Array | None = None, deterministic: bool = True,
               rngs=None, score_offset: jax.Array | None = None,
               return_weights: bool = False):
    """Self attention (`inputs_kv=None`) or cross attention.

    Args:
      inputs_q: `[B, T, D]`.
      inputs_kv: `[B, S, D_kv]`; defaults to `inputs_q`.
      mask: bool broadcastable to `[B, H, T, S]`, True = may attend.
      deterministic: False enables dropout on the weights.
      rngs: `nnx.Rngs` with a 'dropout' stream (or a key) when not deterministic.
      score_offset: `[B, H, T, S]` added to the raw scores before the softmax.
      return_weights: also return `{'scores', 'weights'}` (`[B, H, T, S]`).

    Returns:
      `(out [B, T, D_out], aux or None)`.
    """
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    q = self.project_query(inputs_q)
    k, v = self.project_kv(inputs_kv)
    return self.attend(q, k, v, mask=mask, deterministic=deterministic,
                       dropout_key=None if deterministic else dropout_key(rngs),
                       score_offset=score_offset, return_weights=return_weights)

  # -- autoregressive cache --------------------------------------------------

  def init_cache(self, batch_size: int, max_length: int, dtype: Any = None):
    """Empty self-attention cache: `{'keys': [B, H, L, d_k], 'values': [B, H, L, d_v]}`."""
    dtype = dtype or self.dtype or jnp.float32
    h = self.num_heads
    return {"keys": jnp.zeros((batch_size, h, max_length, self.qk_features), dtype),
            "values": jnp.zeros((batch_size, h, max_length, self.v_features), dtype)}

  def decode_step(self, inputs_q: jax.Array, cache, index, *,
                  return_weights: bool = False):
    """One causal self-attention step with the cache.

    Args:
      inputs_q: `[B, 1, D]`, the new position's input.
      cache: from `init_cache` (or a previous step), leaves `[B, H, L, ·]`.
      index: int32 scalar (may be traced), the new position; keys / values
        are written there and the query attends to positions `<= index`.
      return_weights: as in `attend`.

    Returns:
      `(out [B, 1, D_out], new cache, aux or None)`.
    """
    q = self.project_query(inputs_q)  # [B, H, 1, d_k]
    k, v = self.project_kv(inputs_q)  # [B, H, 1, d]
    zero = jnp.zeros((), jnp.int32)
    index = jnp.asarray(index, jnp.int32)
    start = (zero, zero, index, zero)
    cache = {
        "keys": jax.lax.dynamic_update_slice(cache["keys"], k.astype(cache["keys"].dtype), start),
        "values": jax.lax.dynamic_update_slice(cache["values"], v.astype(cache["values"].dtype), start),
    }
    length = cache["keys"].shape[-2]
    mask = (jnp.arange(length) <= index)[None, None, None, :]  # [1, 1, 1, L]
    out, aux = self.attend(q, cache["keys"], cache["values"], mask=mask,
                           return_weights=return_weights)
    return out, cache, aux


def _merge_heads(context):  # [B, H, T, d_v] -> [B, T, H·d_v]
  merged = jnp.swapaxes(context, -2, -3)
  return merged.reshape(merged.shape[:-2] + (-1,))


def beams_as_queries(x, beams: int):
  """`[B·K, H, 1, d]` -> `[B, H, K, d]`: the K beams of a sentence become K
  query positions, so that cross attention reads one copy of the sentence's
  encoder memory instead of K."""
  bk, h, _, d = x.shape
  return jnp.swapaxes(x.reshape(bk // beams, beams, h, d), 1, 2)
