"""What a score does beyond its formula: its parameters in the layers, the
logits it computes there, and the dot product the fused kernels see in it.

A registry entry (`registry.Score`) carries these pieces, so the layers and
`attention` ask the entry instead of branching on score names:

- `Form`: the score inside one attention layer, `make_params` (the
  parameters it adds to the layer, told the layer's sizes by `Dims`) and
  `logits` (the raw scores of the queries and keys the layer hands over).
  `layers.Attention` (one head, the RNN decoders) uses the entry's `rnn`
  form, `layers.MultiHeadAttention` its `mha` form, with a head axis.
- `DotProduct`: a pure score written as `scale · q' k'ᵀ`, which the blockwise
  and the fused kernels of `attention` compute.
- NumPy references (a `Form`'s `reference`, float64, for the tests) and naive
  float32 einsum forms (a `Score`'s `naive`, for the benchmark), both written
  from the formulas and independent of `scores.py`, so that what they check
  is not the code they check it with.

The forms of the built-in scores are defined here; their formulas are the
pure functions of `scores.py`.

Shape glossary: B batch, H heads, T / Tq query length, S / Tk key length,
dq / dk query / key features, a attention (projection) dimension, L the
longest key axis a layer is built for.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax import scores as scores_lib

__all__ = ["GLOROT", "Dims", "Form", "DotProduct", "no_params", "per_head"]

# Glorot/Xavier uniform: the initialiser of every projection in the library
# (by default also of the multi-head query/key kernels: `layers.QK_INITS`).
GLOROT = nnx.initializers.xavier_uniform()


@dataclasses.dataclass(frozen=True)
class Dims:
  """What a layer tells a score that creates its parameters.

  Attributes:
    query_dim / key_dim: the sizes of the layer's query and key inputs (the
      RNN layer: dq and dk; the multi-head layer: d_k, the per-head size).
    attention_dim: a, the size of the layer's query / key projections.
    max_length: L, the longest key axis the layer is built for (None if the
      layer was given none).
    heads: H of the multi-head layer; None in the single-head RNN layer.
    dtype / param_dtype: the layer's compute and parameter dtypes.
  """
  query_dim: int
  key_dim: int
  attention_dim: int
  max_length: int | None = None
  heads: int | None = None
  dtype: Any = None
  param_dtype: Any = jnp.float32


def no_params(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """The `make_params` of a score without parameters of its own."""
  del dims, rngs
  return {}


@dataclasses.dataclass(frozen=True)
class Form:
  """A score inside one attention layer.

  Attributes:
    logits: `(q, k, **params) -> [..., Tq, Tk]`, the raw scores of the query
      and keys the layer hands over (see `registry.Score.rnn` / `.mha`), with
      the parameters `make_params` made, passed by name. The layer casts q,
      k and every `nnx.Param` to its compute dtype first and the result to
      float32 after; a module (e.g. an `nnx.Linear`) is passed as it is.
    make_params: `(Dims, nnx.Rngs) -> {name: nnx.Param or nnx.Module}`. The
      layer sets them as its attributes under these names, which are the
      paths of its state (checkpoints are read by them); they are created in
      the order given, which fixes the keys they draw from `rngs.params`.
    reference: `(q, k, **params) -> [..., Tq, Tk]` in NumPy (float64), the
      same scores written from the formula, which the tests compare the layer
      with: q and k as `logits` gets them, every parameter as a NumPy array
      (a module as the dict of its parameters, e.g. `{'kernel', 'bias'}`).
      None: the layers' tests fail for the score, naming the field.
    kernel: optional `(q, k, values, mask, **params) -> context or None`: the
      whole attention (softmax and weighted sum too) by a fused kernel, for
      the multi-head layer when it needs neither the weights nor dropout
      nor a score offset; None returned where the kernel would not win on
      this backend at these sizes (the layer then takes its plain path).
      q, k, values and the parameters come in the layer's compute dtype;
      `mask` is a bool array broadcastable to `[B, H, Tq, Tk]` or None.
  """
  logits: Callable[..., jax.Array]
  make_params: Callable[[Dims, nnx.Rngs], dict[str, Any]] = no_params
  reference: Callable[..., np.ndarray] | None = None
  kernel: Callable[..., jax.Array | None] | None = None


@dataclasses.dataclass(frozen=True)
class DotProduct:
  """A pure score that is one scaled dot product, `f(q, k) = scale · q' k'ᵀ`.

  Attributes:
    serves: `(query, keys, params) -> bool`, whether it is one for these
      inputs (e.g. the same feature size on both sides).
    operands: `(query, keys, params) -> (q', k', scale)`; scale None stands
      for `1/√d` (the default of the blockwise and fused kernels).
  """
  serves: Callable[[jax.Array, jax.Array, Mapping[str, Any]], bool]
  operands: Callable[[jax.Array, jax.Array, Mapping[str, Any]], tuple]


def per_head(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """`fn(q, k, **params)` of one head, mapped over the head axis: q and k
  `[B, H, T, d]` (axis 1), every parameter `[H, ...]` (axis 0, as vmap maps
  keyword arguments) -> `[B, H, Tq, Tk]`."""
  return jax.vmap(fn, in_axes=(1, 1), out_axes=1)


def _param(init, rngs: nnx.Rngs, shape: tuple, dtype) -> nnx.Param:
  return nnx.Param(init(rngs.params(), shape, dtype))


def _constant(value: float, shape: tuple, dtype) -> nnx.Param:
  return nnx.Param(jnp.full(shape, value, dtype))


# -- dot products: dot, scaled_dot, general, cosine ----------------------------


def _same_size(query, keys, params) -> bool:
  del params
  return query.shape[-1] == keys.shape[-1]


def _always(query, keys, params) -> bool:
  del query, keys, params
  return True


def _unscaled(query, keys, params):
  del params
  return query, keys, 1.0


def _scaled_by_root_d(query, keys, params):
  del params
  return query, keys, None


def _general_operands(query, keys, params):
  """W folded into the query: `(q W) kᵀ`."""
  w = jnp.asarray(params["w"])
  return jnp.matmul(query, w.astype(query.dtype)), keys, 1.0  # [..., Tq, dk]


DOT = DotProduct(_same_size, _unscaled)
SCALED_DOT = DotProduct(_same_size, _scaled_by_root_d)
GENERAL = DotProduct(_always, _general_operands)


def _cosine_serves(query, keys, params) -> bool:
  """Both sides the same size, and `beta` a scalar or per query `[..., Tq, 1]`
  (a per-key beta cannot be folded into the query)."""
  beta_shape = jnp.shape(params.get("beta", 1.0))
  return _same_size(query, keys, params) and (not beta_shape or beta_shape[-1] == 1)


def _cosine_operands(query, keys, params):
  """Unit vectors on both sides (the 1e-6 norm clamp of `scores.cosine`),
  beta folded into the query."""
  beta = jnp.asarray(params.get("beta", 1.0))
  unit = scores_lib.unit_vectors
  return beta.astype(query.dtype) * unit(query), unit(keys), 1.0


COSINE = DotProduct(_cosine_serves, _cosine_operands)


# -- additive --------------------------------------------------------------------

# The additive score's `[B, Tq, S, a]` tanh block, recomputed in the backward
# pass instead of stored: inside the RNN decoder's `lax.scan` a stored block
# is stacked over all T steps (`[T, B, 1, S, a]`, 537 MB per step at B = 64,
# T = S = 32, a = 1024), and zero-filling and re-reading that buffer cost more
# than the recomputed tanh on 2 CPU cores (measured with a jax.profiler trace of the quick model).
_additive_rematerialised = jax.checkpoint(scores_lib.additive_projected)


def additive_of_projections(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """`vᵀ tanh(q + k)` of the RNN layer's projected query `[B, Tq, a]` and keys
  `[B, S, a]` -> `[B, Tq, S]`. The keys were projected once (`prepare`),
  outside the decoder's scan, which `scores.additive` would redo at every
  step; with one query per step the tanh block is only `[B, 1, S, a]`, so the
  chunking `scores.additive` offers for long query axes is not needed."""
  return _additive_rematerialised(q, k, v)


def additive_v(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """`v [a]` ~ N(0, 1/a): Var(vᵀx) = Var(x) for unit-variance x, so the score
  starts at unit scale."""
  a = dims.attention_dim
  return {"v": _param(nnx.initializers.normal(a ** -0.5), rngs, (a,), dims.param_dtype)}


def additive_heads(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """Per head `W_1, W_2 [H, d_k, d_k]` (Glorot) and `v [H, d_k]` ~ N(0, 1/d_k),
  on top of the head projections."""
  h, d, dtype = dims.heads, dims.key_dim, dims.param_dtype
  return {"w_q": _param(GLOROT, rngs, (h, d, d), dtype),
          "w_k": _param(GLOROT, rngs, (h, d, d), dtype),
          "v": _param(nnx.initializers.normal(d ** -0.5), rngs, (h, d), dtype)}


def additive_per_head(q: jax.Array, k: jax.Array, w_q: jax.Array, w_k: jax.Array,
                      v: jax.Array) -> jax.Array:
  """`scores.additive` of every head with its own `W_1, W_2, v` (`[H, ...]`);
  it chunks the `[B, T, S, a]` tanh block when it is large."""
  return per_head(scores_lib.additive)(q, k, w_q=w_q, w_k=w_k, v=v)


def additive_heads_kernel(q: jax.Array, k: jax.Array, values: jax.Array, mask, *,
                          w_q: jax.Array, w_k: jax.Array, v: jax.Array) -> jax.Array | None:
  """The per-head additive attention by the fused Pallas kernels
  (`pallas_additive`), where `pallas_additive.wins` takes them (a TPU or GPU,
  where the plain path would chunk the `[B, H, T, S, d_k]` tanh block); else
  None. q `[B, H, T, d_k]`, k `[B, H, S, d_k]`, values `[B, H, S, d_v]`,
  `w_q, w_k [H, d_k, d_k]`, `v [H, d_k]` -> context `[B, H, T, d_v]`."""
  from attention_jax import pallas_additive  # pylint: disable=g-import-not-at-top
  lead = math.prod(jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
  if not pallas_additive.wins(lead, q.shape[-2], k.shape[-2], w_q.shape[-1],
                              jax.default_backend()):
    return None
  # Each head's own projections, accumulated in float32 as `scores.additive` does.
  q_proj = jnp.einsum("...htd,hda->...hta", q, w_q, preferred_element_type=jnp.float32)
  k_proj = jnp.einsum("...hsd,hda->...hsa", k, w_k, preferred_element_type=jnp.float32)
  return pallas_additive.additive_attention_projected(q_proj, k_proj, values, v, mask)


# -- general, cosine, qk_norm ----------------------------------------------------


def general_w(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """`W [dq, dk]` (the RNN layer) or `[H, d_k, d_k]` (per head), Glorot."""
  shape = (dims.query_dim, dims.key_dim)
  return {"w": _param(GLOROT, rngs, shape if dims.heads is None else (dims.heads,) + shape,
                      dims.param_dtype)}


def general_per_head(q: jax.Array, k: jax.Array, w: jax.Array) -> jax.Array:
  """`scores.general` of every head with its own `W` (`w [H, d_k, d_k]`)."""
  return per_head(scores_lib.general)(q, k, w=w)


def cosine_beta(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """β = √dk, one per head in the multi-head layer: cosines of random vectors
  have std 1/√d, so the scores start at unit scale."""
  del rngs
  shape = () if dims.heads is None else (dims.heads,)
  return {"beta": _constant(math.sqrt(dims.key_dim), shape, dims.param_dtype)}


def cosine_per_head(q: jax.Array, k: jax.Array, beta: jax.Array) -> jax.Array:
  """`scores.cosine` with one β per head, `beta [H]`."""
  return scores_lib.cosine(q, k, beta[:, None, None])


def qk_norm_g(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """One g per layer (shared by the heads), starting at log₂(L² − L) (Henry
  et al. 2020)."""
  del rngs
  return {"g": _constant(scores_lib.qk_norm_init(dims.max_length), (), dims.param_dtype)}


# -- location --------------------------------------------------------------------


def location_proj(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """`W_a s + b_a`: a Linear(dq -> L) with bias (Glorot), one output per
  source position."""
  return {"location_proj": nnx.Linear(
      dims.query_dim, dims.max_length, use_bias=True, kernel_init=GLOROT, dtype=dims.dtype,
      param_dtype=dims.param_dtype, rngs=rngs)}


def location(q: jax.Array, k: jax.Array, location_proj: nnx.Linear) -> jax.Array:
  """`(W_a s + b_a)[:S]` of the RNN layer: `[B, Tq, S]`."""
  src_len = k.shape[-2]
  if src_len > location_proj.out_features:
    raise ValueError(
        f"score 'location' was built for max_source_length="
        f"{location_proj.out_features}, got a source of length {src_len}.")
  return location_proj(q)[..., :src_len]  # [B, Tq, S]


def location_heads(dims: Dims, rngs: nnx.Rngs) -> dict[str, Any]:
  """Per head `W_a [H, d_k, L]` (Glorot) and `b_a [H, L]` (zeros)."""
  h, d, length = dims.heads, dims.key_dim, dims.max_length
  return {"w_loc": _param(GLOROT, rngs, (h, d, length), dims.param_dtype),
          "b_loc": nnx.Param(jnp.zeros((h, length), dims.param_dtype))}


def location_per_head(q: jax.Array, k: jax.Array, w_loc: jax.Array,
                      b_loc: jax.Array) -> jax.Array:
  """`(q W_a + b_a)[:S]` of every head: `[B, H, T, S]`."""
  src_len = k.shape[-2]
  if src_len > w_loc.shape[-1]:
    raise ValueError(f"score 'location' was built for max_length={w_loc.shape[-1]}, "
                     f"got {src_len} keys.")
  return (jnp.einsum("bhtd,hdl->bhtl", q, w_loc) + b_loc[:, None, :])[..., :src_len]


# -- NumPy references of the layers' logits (float64; `Form.reference`) ----------


def _t(x: np.ndarray) -> np.ndarray:
  """The last two axes swapped: `kᵀ` of keys `[..., S, d]`."""
  return np.swapaxes(x, -1, -2)


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def dot_reference(q, k):
  """`q kᵀ`."""
  return q @ _t(k)


def scaled_dot_reference(q, k):
  """`q kᵀ / √d`."""
  return q @ _t(k) / np.sqrt(q.shape[-1])


def inverse_dim_reference(q, k):
  """`q kᵀ / d` (μP)."""
  return q @ _t(k) / q.shape[-1]


def qk_norm_reference(q, k, g):
  """`g · q̂ k̂ᵀ`, one g for every head."""
  return g * (_unit(q) @ _t(_unit(k)))


def additive_reference(q, k, v):
  """`vᵀ tanh(q + k)` of the RNN layer's projections."""
  return np.tanh(q[..., :, None, :] + k[..., None, :, :]) @ v


def additive_heads_reference(q, k, w_q, w_k, v):
  """`v_hᵀ tanh(q W_1,h + k W_2,h)` per head h of `[B, H, T, d]` heads."""
  qp = np.einsum("bhtd,hda->bhta", q, w_q)
  kp = np.einsum("bhsd,hda->bhsa", k, w_k)
  return np.einsum("bhtsa,ha->bhts", np.tanh(qp[:, :, :, None] + kp[:, :, None]), v)


def general_reference(q, k, w):
  """`q W kᵀ`."""
  return q @ w @ _t(k)


def general_heads_reference(q, k, w):
  """`q W_h kᵀ` per head."""
  return np.einsum("bhtd,hde,bhse->bhts", q, w, k)


def cosine_reference(q, k, beta):
  """`β · cos(q, k)`, one β."""
  return beta * (_unit(q) @ _t(_unit(k)))


def cosine_heads_reference(q, k, beta):
  """`β_h · cos(q, k)` per head."""
  return beta[None, :, None, None] * (_unit(q) @ _t(_unit(k)))


def location_reference(q, k, location_proj):
  """`(W_a s + b_a)[:S]`."""
  return (q @ location_proj["kernel"] + location_proj["bias"])[..., :k.shape[-2]]


def location_heads_reference(q, k, w_loc, b_loc):
  """`(q W_a,h + b_a,h)[:S]` per head."""
  return (np.einsum("bhtd,hdl->bhtl", q, w_loc) + b_loc[None, :, None, :])[..., :k.shape[-2]]


# -- naive float32 forms of the pure functions (`Score.naive`, the benchmark) ----

_HIGHEST = jax.lax.Precision.HIGHEST


def _f32(x) -> jax.Array:
  return jnp.asarray(x).astype(jnp.float32)


def dot_naive(q, k):
  """`q kᵀ` by an explicit float32 einsum."""
  return jnp.einsum("...qd,...kd->...qk", _f32(q), _f32(k), precision=_HIGHEST)


def scaled_dot_naive(q, k):
  """`q kᵀ / √d`."""
  return dot_naive(q, k) / math.sqrt(jnp.shape(q)[-1])


def general_naive(q, k, w):
  """`q W kᵀ`."""
  return jnp.einsum("...qd,de,...ke->...qk", _f32(q), _f32(w), _f32(k), precision=_HIGHEST)


def cosine_naive(q, k, beta=1.0):
  """`β · cos(q, k)`, norms clamped at 1e-6."""
  q, k = _f32(q), _f32(k)
  qn = q / jnp.maximum(jnp.linalg.norm(q, axis=-1, keepdims=True), 1e-6)
  kn = k / jnp.maximum(jnp.linalg.norm(k, axis=-1, keepdims=True), 1e-6)
  return _f32(beta) * dot_naive(qn, kn)


def additive_naive(q, k, w_q, w_k, v):
  """`vᵀ tanh(q W_q + k W_k)` in one `[..., Tq, Tk, a]` block."""
  qa = jnp.einsum("...qd,da->...qa", _f32(q), _f32(w_q), precision=_HIGHEST)
  ka = jnp.einsum("...kd,da->...ka", _f32(k), _f32(w_k), precision=_HIGHEST)
  hidden = jnp.tanh(qa[..., :, None, :] + ka[..., None, :, :])  # [..., Tq, Tk, a]
  return jnp.einsum("...qka,a->...qk", hidden, _f32(v), precision=_HIGHEST)
