"""Flax NNX attention layers built on the pure functions of `attention_jax`.

Two layers, both with the score function chosen by name (`SCORES`):

- `Attention`: single-head attention for RNN decoders (docs/formulas.md §2), query =
  decoder state, keys = values = encoder states, with the score's parameters
  and a `prepare` step that projects the keys once per source sentence, so a
  decoder `lax.scan` does only the query-side work at every step.
- `MultiHeadAttention`: the Transformer's multi-head attention (docs/formulas.md §4)
  with any score applied per head, masks, dropout on the weights, bfloat16
  compute with float32 parameters, an autoregressive key/value cache and the
  attention weights returned on request, or sown for diagnostics in a view
  (`nnx.view(model, sow_attention=True)`, read with `nnx.capture`).

Score names and formulas: `registry.SCORES` (Britz et al. 2017 eq. 6-7,
Luong et al. 2015, Vaswani et al. 2017). The layers hold the entry of their
score, which creates the score's own parameters on the layer and computes its
logits (`Score.rnn` in `Attention`, `Score.mha` in `MultiHeadAttention`); they
add the projections, masks, dropout and dtypes, and branch on no score name.

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

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.attention import MaskStructure, attend, attention, select_implementation
from attention_jax import registry
from attention_jax import score_kinds

__all__ = ["SCORES", "GLOROT", "QK_INITS", "check_score", "Attention", "MultiHeadAttention",
           "KVCache", "dropout_key", "beams_as_queries"]

SCORES = registry.LAYER_SCORES

GLOROT = score_kinds.GLOROT

# LeCun normal: variance 1 / fan_in, so a projection of inputs whose
# coordinates have mean square 1 has outputs of variance 1 whatever its
# fan_out (Glorot's 2 / (fan_in + fan_out) shrinks them as H·d_k grows).
LECUN = nnx.initializers.lecun_normal()

# The initialisers of `MultiHeadAttention`'s query and key projection kernels
# W^Q, W^K by name (`qk_init`): (query, key). Their biases start at zero and
# every other parameter keeps its own initialiser under each.
#   glorot      Glorot uniform, as every projection of the library.
#   premise     LeCun normal: on inputs of unit mean square (a LayerNorm's
#               output) every q and k coordinate has variance ~1 at any d_k,
#               so the unscaled q·k has std ~√d_k: the premise of Vaswani
#               et al.'s footnote 4, true at step 0.
#   zero_query  W^Q zeros (muP): q = the zero bias = 0, so every logit starts
#               at 0 whatever d_k; W^K LeCun normal as under premise. Not
#               both zero: each one's gradient goes through the other's
#               output (dL/dW^Q through k), so neither would ever move.
QK_INITS = {
    "glorot": (GLOROT, GLOROT),
    "premise": (LECUN, LECUN),
    "zero_query": (nnx.initializers.zeros_init(), LECUN),
}


def dense(layer: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
  """`layer(x)` over the last axis of `x [..., in]` (an `nnx.Linear`, or any
  map of the last axis such as `nnx.Embed.attend`); on CPUs as one 2-D
  product `[N, in] @ [in, out]`, reshaped back to `[..., out]`. The same
  numbers either way, to float32 rounding.

  Why on CPUs: with a batch of leading axes, the kernel's gradient contracts
  over all of them, and XLA:CPU (jax 0.10.2) then transposes the output
  gradient and takes a slow matrix-product path: the quick RNN's output layer
  ([64, 32, 128] @ [128, 2000], log-softmax loss, forward and backward) takes
  54 ms that way and 24 ms flattened, on one core of the 2-core Xeon
  (results/cpu_efficiency/round2/micro.log, commit c8b4b72; experiments/cpu_efficiency/cpu_micro.py).
  The Transformer preset's whole step (2 seeds) took 0.70-0.75x its time at
  d_k 16 and 0.63-0.65x at d_k 256 once its products went through here
  (results/cpu_efficiency/transformer_flat, commit 3f9b604).

  Why only there: compiled for a TPU v5e, the flattened form made the `gpu`
  sweep's step (additive a = 128) count 94 GB of memory traffic and 20.7k ops
  instead of 55 GB and 15.2k (bisected to the commit that introduced it; its
  reshapes inside the decoder's loop are layout changes in a TPU's tiled
  layout); on an H100 it changed nothing (results/compile_check)."""
  if x.ndim <= 2 or jax.default_backend() != "cpu":
    return layer(x)
  lead = x.shape[:-1]
  return layer(x.reshape(-1, x.shape[-1])).reshape(*lead, -1)


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


def _check_offset(score_offset, shape, where: str):
  if score_offset is None:
    return None
  score_offset = jnp.asarray(score_offset)
  if tuple(score_offset.shape) != tuple(shape):
    raise ValueError(
        f"`score_offset` must have the scores' shape {tuple(shape)} ({where}), "
        f"got {tuple(score_offset.shape)}.")
  return score_offset.astype(jnp.float32)


def _add_score_params(layer: nnx.Module, form: score_kinds.Form, dims: score_kinds.Dims,
                      rngs: nnx.Rngs) -> tuple[str, ...]:
  """Sets the parameters `form` makes as attributes of `layer` (their names
  are the paths of its state); returns their names."""
  made = form.make_params(dims, rngs)
  for name, value in made.items():
    if hasattr(layer, name):
      raise ValueError(f"score {layer.score!r}: its parameter {name!r} would replace "
                       f"the layer's own attribute of that name.")
    setattr(layer, name, value)
  return tuple(made)


def _score_logits(layer: nnx.Module, form: score_kinds.Form, q, k, dtype) -> jax.Array:
  """`form.logits` of q and k with the layer's score parameters, all in
  `dtype` (modules as they are), as float32."""
  params = {name: getattr(layer, name) for name in layer.score_params}
  params = {name: p[...].astype(dtype) if isinstance(p, nnx.Variable) else p
            for name, p in params.items()}
  return form.logits(q.astype(dtype), k.astype(dtype), **params).astype(jnp.float32)


class Attention(nnx.Module):
  """Single-head attention of an RNN decoder over the encoder states.

  Usage inside a decoder loop (keys projected once, outside the loop)::

    prepared = attn.prepare(encoder_states)          # once per sentence
    context, weights, scores = attn(query, prepared, encoder_states, mask=valid)

  Parameters: for `projected` scores Linear(dq→a) + Linear(dk→a) (with bias,
  Glorot; `query_proj`, `key_proj`), a = `attention_dim`; then the score's
  own (`registry.Score.rnn`): `additive` `v [a]`; `qk_norm` scalar `g`
  (init log₂(L² − L), L = `max_source_length`); `general` `w [dq, dk]`
  (Glorot); `cosine` scalar `beta` (init √dk); `location`
  Linear(dq→max_source_length) (`location_proj`).
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
    self.score, self.spec = score, spec
    self.query_dim, self.key_dim = query_dim, key_dim
    self.attention_dim = attention_dim or key_dim
    self.max_source_length = max_source_length
    self.dtype = dtype
    a = self.attention_dim
    if spec.projected:
      linear = dict(use_bias=True, kernel_init=GLOROT, dtype=dtype,
                    param_dtype=param_dtype, rngs=rngs)
      self.query_proj = nnx.Linear(query_dim, a, **linear)
      self.key_proj = nnx.Linear(key_dim, a, **linear)
    self.score_params = _add_score_params(self, spec.rnn, score_kinds.Dims(
        query_dim, key_dim, a, max_source_length, None, dtype, param_dtype), rngs)

  @property
  def projected(self) -> bool:
    """Whether the score projects query and key to `a` features (the registry's word)."""
    return self.spec.projected

  def prepare(self, keys: jax.Array) -> jax.Array:
    """Key-side work done once per sentence: `[B, S, dk]` -> `[B, S, a]`
    (projected keys) for additive / multiplicative scores, else `keys` as is."""
    if self.projected:
      return dense(self.key_proj, keys)  # [B, S, a]
    return keys

  def scores(self, query: jax.Array, prepared: jax.Array) -> jax.Array:
    """Raw scores, float32: query `[B, Tq, dq]`, prepared keys `[B, S, ·]`
    -> `[B, Tq, S]`. A projected score is computed in the projections' dtype,
    the others in the layer's `dtype` (default: the inputs' promoted dtype)."""
    if self.projected:
      query = dense(self.query_proj, query)  # [B, Tq, a]
      dtype = query.dtype
    else:
      dtype = self.dtype or jnp.result_type(query, prepared)
    return _score_logits(self, self.spec.rnn, query, prepared, dtype)  # [B, Tq, S]

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """The self-attention keys and values of the positions decoded so far.

  A pytree whose leaves have the batch as their leading axis, so it rides in
  a `lax.while_loop` carry and beam search can repeat and reorder its rows.
  The position being decoded is not kept in it: the decoder passes the one
  it also embeds (`MultiHeadAttention.decode_step`).

  Attributes:
    keys: `[B, H, L, d_k]`.
    values: `[B, H, L, d_v]`.
  """
  keys: jax.Array
  values: jax.Array

  @classmethod
  def empty(cls, batch_size: int, num_heads: int, length: int, qk_features: int,
            v_features: int, dtype: Any = jnp.float32) -> "KVCache":
    """Zeros for `length` positions."""
    return cls(jnp.zeros((batch_size, num_heads, length, qk_features), dtype),
               jnp.zeros((batch_size, num_heads, length, v_features), dtype))

  def write(self, k: jax.Array, v: jax.Array, index) -> "KVCache":
    """The cache with `k [B, H, 1, d_k]`, `v [B, H, 1, d_v]` at position
    `index` (an int32 scalar, may be traced)."""
    zero = jnp.zeros((), jnp.int32)
    start = (zero, zero, jnp.asarray(index, jnp.int32), zero)
    return KVCache(jax.lax.dynamic_update_slice(self.keys, k.astype(self.keys.dtype), start),
                   jax.lax.dynamic_update_slice(self.values, v.astype(self.values.dtype), start))

  def visible(self, index) -> jax.Array:
    """bool `[1, 1, 1, L]`: the positions `<= index` a causal query at `index` sees."""
    length = self.keys.shape[-2]
    return (jnp.arange(length) <= jnp.asarray(index, jnp.int32))[None, None, None, :]


def _check_heads(num_heads, in_features, qk_features, v_features, dropout_rate,
                 score, max_length, qk_init) -> registry.Score:
  """The registry entry of `score` once the arguments of a
  `MultiHeadAttention` are valid; a ValueError naming the first that is not."""
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
  if qk_init not in QK_INITS:
    raise ValueError(f"`qk_init` must be one of {tuple(QK_INITS)}, got {qk_init!r}.")
  return spec


class MultiHeadAttention(nnx.Module):
  """Multi-head attention `Concat(head_1..head_h) W^O` with any score per head:
  `head_i = Attention_score(x_q W^Q_i, x_kv W^K_i, x_kv W^V_i)`, each projection
  one `D x H·d` Linear for all heads (bias, Glorot; W^Q and W^K as `qk_init`
  names, `QK_INITS`), plus the score's own parameters (`registry.Score.mha`).
  Decoding: `init_cache`, then `decode_step` writes one step's keys and values
  into the `KVCache` and attends the prefix."""

  def __init__(self, num_heads: int, in_features: int, *,
               kv_features: int | None = None, qk_features: int | None = None,
               v_features: int | None = None, out_features: int | None = None,
               score: str = "scaled_dot", dropout_rate: float = 0.0,
               max_length: int | None = None, use_bias: bool = True,
               qk_init: str = "glorot",
               dtype: Any = None, param_dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    """Args:
      num_heads / in_features: H, and D the query input width.
      kv_features / out_features: key/value input and output widths (default D).
      qk_features / v_features: per-head query/key and value sizes d_k, d_v
        (default D / H; D % H must then be 0).
      score: a name from `SCORES`; max_length: the longest key axis (for the
        scores that `needs_length`: `location`, `qk_norm`).
      dropout_rate / use_bias: dropout on the weights; bias in every projection.
      qk_init: the initialisers of the query and key kernels, a name in
        `QK_INITS` ('glorot', 'premise', 'zero_query'); the value and output
        projections are Glorot under each.
      dtype / param_dtype / rngs: compute and parameter dtypes, initialisation.
    """
    spec = _check_heads(num_heads, in_features, qk_features, v_features, dropout_rate,
                        score, max_length, qk_init)
    self.num_heads, self.score, self.spec = num_heads, score, spec
    self.qk_features = qk_features or in_features // num_heads
    self.v_features = v_features or in_features // num_heads
    self.dropout_rate, self.max_length, self.dtype = dropout_rate, max_length, dtype
    h, dk, dv = num_heads, self.qk_features, self.v_features
    linear = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    query_init, key_init = QK_INITS[qk_init]
    self.query = nnx.Linear(in_features, h * dk, kernel_init=query_init, **linear)
    self.key = nnx.Linear(kv_features or in_features, h * dk, kernel_init=key_init, **linear)
    self.value = nnx.Linear(kv_features or in_features, h * dv, kernel_init=GLOROT, **linear)
    self.out = nnx.Linear(h * dv, out_features or in_features, kernel_init=GLOROT, **linear)
    self.score_params = _add_score_params(self, spec.mha, score_kinds.Dims(
        dk, dk, dk, max_length, h, dtype, param_dtype), rngs)
    self.dropout = nnx.Dropout(dropout_rate)
    self.sow_attention = False

  def set_view(self, sow_attention: bool | None = None):
    """`nnx.view(model, sow_attention=True)`: a view of the model whose
    attention layers sow what they compute (see `attend`), for diagnostics
    read with `nnx.capture(view, nnx.Intermediate)`.

    Args:
      sow_attention: True: every `attend` takes the plain kernel (the fused
        and blockwise ones never form the weights) and sows
        `{'scores', 'weights'}` (as `attend`'s aux) as the `nnx.Intermediate`
        named 'attention'. Outside `nnx.capture`, Flax would store that as a
        new variable of the module: use the view under `nnx.capture` only.
    """
    if sow_attention is not None:
      self.sow_attention = sow_attention

  def project_query(self, inputs_q: jax.Array) -> jax.Array:
    """`[B, T, D]` -> per-head queries `[B, H, T, d_k]`."""
    return _split_heads(dense(self.query, inputs_q), self.num_heads, self.qk_features)

  def project_kv(self, inputs_kv: jax.Array):
    """`[B, S, D_kv]` -> per-head `(keys [B, H, S, d_k], values [B, H, S, d_v])`."""
    return (_split_heads(dense(self.key, inputs_kv), self.num_heads, self.qk_features),
            _split_heads(dense(self.value, inputs_kv), self.num_heads, self.v_features))

  def scores(self, q: jax.Array, k: jax.Array) -> jax.Array:
    """Raw per-head scores, float32: q `[B, H, T, d_k]`, k `[B, H, S, d_k]` ->
    `[B, H, T, S]`, computed in the layer's `dtype` (default: the inputs' promoted
    dtype; float32 for float16, whose scores beyond 65504 would be inf)."""
    dtype = self.dtype or jnp.result_type(q, k)
    if dtype == jnp.float16:
      dtype = jnp.float32
    return _score_logits(self, self.spec.mha, q, k, dtype)  # [B, H, T, S]

  def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, *,
             mask: jax.Array | MaskStructure | None = None, deterministic: bool = True,
             dropout_key: jax.Array | None = None,
             score_offset: jax.Array | None = None,
             return_weights: bool = False):
    """Attention over already projected heads, then the output projection.

    Args:
      q, k, v: `[B, H, T, d_k]`, `[B, H, S, d_k]`, `[B, H, S, d_v]`.
      mask: bool broadcastable to `[B, H, T, S]`, True = may attend; or a
        `MaskStructure` (causal, lengths), which reaches cuDNN as such.
      deterministic / dropout_key: False applies dropout to the weights,
        drawn with `dropout_key` (a jax key).
      score_offset: float `[B, H, T, S]` added to the raw scores.
      return_weights: return `aux = {'scores', 'weights'}`, both `[B, H, T, S]`
        float32 (scores raw: before offset and mask; weights before dropout);
        otherwise aux is None.

    Returns: `(out [B, T, D_out], aux)`. In a view with `sow_attention`
    (`set_view`) the layer also sows that aux as the `nnx.Intermediate`
    'attention', taking the plain kernel as `return_weights` does.
    """
    use_dropout = not deterministic and self.dropout_rate > 0.0
    if use_dropout and dropout_key is None:
      raise ValueError("deterministic=False with dropout needs `rngs` / a dropout key.")
    plain_needed = (return_weights or use_dropout or score_offset is not None
                    or self.sow_attention)
    if _hands_over(self.spec, q, k, v, plain_needed):
      dtype = self.dtype or jnp.result_type(q, k, v)  # blockwise or fused (cuDNN on GPUs)
      masks = mask.arguments() if isinstance(mask, MaskStructure) else {"mask": mask}
      context = attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                          score=self.spec.fused, implementation="auto", **masks)
      return dense(self.out, _merge_heads(context)), None  # [B, T, D_out]
    if isinstance(mask, MaskStructure):
      mask = mask.dense(q.shape[-2], k.shape[-2])
    if self.spec.mha.kernel is not None and not plain_needed:
      context = _kernel_context(self, q, k, v, mask)  # [B, H, T, d_v] or None
      if context is not None:
        return dense(self.out, _merge_heads(context)), None  # [B, T, D_out]
    raw = self.scores(q, k)  # [B, H, T, S]
    offset = _check_offset(score_offset, raw.shape, "MultiHeadAttention")
    v = v.astype(self.dtype or v.dtype)
    context, weights = attend(raw if offset is None else raw + offset, v, mask)
    if use_dropout:  # the context of the dropped-out weights
      context = _mix(self.dropout(weights, deterministic=False, rngs=dropout_key), v)
    aux = {"scores": raw, "weights": weights}
    if self.sow_attention:
      self.sow(nnx.Intermediate, "attention", aux)
    return dense(self.out, _merge_heads(context)), aux if return_weights else None  # [B, T, D_out]

  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array | None = None, *,
               mask: jax.Array | None = None, deterministic: bool = True,
               rngs=None, score_offset: jax.Array | None = None,
               return_weights: bool = False):
    """Self attention (`inputs_kv=None`) or cross attention of `inputs_q [B, T, D]`
    over `inputs_kv [B, S, D_kv]`: `attend` of their projections, the dropout key
    drawn from `rngs` (`nnx.Rngs` with a 'dropout' stream, or a key) when not
    deterministic. Returns `(out [B, T, D_out], aux or None)`."""
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    q = self.project_query(inputs_q)
    k, v = self.project_kv(inputs_kv)
    return self.attend(q, k, v, mask=mask, deterministic=deterministic,
                       dropout_key=None if deterministic else dropout_key(rngs),
                       score_offset=score_offset, return_weights=return_weights)

  def init_cache(self, batch_size: int, max_length: int, dtype: Any = None) -> KVCache:
    """An empty `KVCache` of `max_length` positions (dtype: the compute dtype, else float32)."""
    return KVCache.empty(batch_size, self.num_heads, max_length, self.qk_features,
                         self.v_features, dtype or self.dtype or jnp.float32)

  def decode_step(self, inputs_q: jax.Array, cache: KVCache, index, *,
                  return_weights: bool = False):
    """One causal self-attention step of `inputs_q [B, 1, D]` at position
    `index` (int32 scalar, may be traced): its keys and values are written
    into `cache` there and it attends to positions `<= index`. Returns
    `(out [B, 1, D_out], new cache, aux or None)` (aux as in `attend`)."""
    q = self.project_query(inputs_q)  # [B, H, 1, d_k]
    cache = cache.write(*self.project_kv(inputs_q), index)
    out, aux = self.attend(q, cache.keys, cache.values, mask=cache.visible(index),
                           return_weights=return_weights)
    return out, cache, aux


def _kernel_context(layer: "MultiHeadAttention", q, k, v, mask):
  """The score's own fused kernel (`Form.kernel`) of the projected heads, all
  in the layer's compute dtype (as `_score_logits` casts them), or None where
  it does not win here."""
  dtype = layer.dtype or jnp.result_type(q, k, v)
  params = {name: getattr(layer, name) for name in layer.score_params}
  params = {name: p[...].astype(dtype) if isinstance(p, nnx.Variable) else p
            for name, p in params.items()}
  context = layer.spec.mha.kernel(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                                  mask, **params)
  return None if context is None else context.astype(dtype)


def _hands_over(spec: registry.Score, q, k, v, plain_needed: bool) -> bool:
  """Whether `MultiHeadAttention.attend` hands its heads to `attention`, whose
  blockwise or fused kernel computes the score's `fused` pure score of the
  projected heads (`select_implementation`). Scores with parameters of their
  own, and dropout on the weights, offsets or weights asked for, need the
  layer's plain path."""
  return spec.fused is not None and select_implementation(
      spec.fused, "auto", q, k, v, return_weights=plain_needed) != "plain"


def _split_heads(x, num_heads: int, size: int):  # [B, T, H·d] -> [B, H, T, d]
  x = x.reshape(x.shape[:-1] + (num_heads, size))
  return jnp.swapaxes(x, -2, -3)


def _mix(weights, values):
  """`weights [..., T, S] @ values [..., S, d]` accumulated in float32, in the values' dtype."""
  return jnp.matmul(weights.astype(values.dtype), values,
                    preferred_element_type=jnp.float32).astype(values.dtype)


def _merge_heads(context):  # [B, H, T, d_v] -> [B, T, H·d_v]
  merged = jnp.swapaxes(context, -2, -3)
  return merged.reshape(merged.shape[:-2] + (-1,))


def beams_as_queries(x, beams: int):
  """`[B·K, H, 1, d]` -> `[B, H, K, d]`: the K beams of a sentence become K
  query positions, so that cross attention reads one copy of the sentence's
  encoder memory instead of K."""
  bk, h, _, d = x.shape
  return jnp.swapaxes(x.reshape(bk // beams, beams, h, d), 1, 2)
