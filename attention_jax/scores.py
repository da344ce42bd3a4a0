"""Attention score functions f(query, key) -> scores (docs/formulas.md §3).

Pure JAX: no parameters are created here, weights are passed in. Every
function maps

  query `q [..., Tq, dq]`, keys `k [..., Tk, dk]`  ->  scores `[..., Tq, Tk]`

with the leading (batch, head, ...) axes broadcast against each other.

Shape glossary: Tq query length, Tk key length, dq / dk feature sizes,
a attention (projection) dimension.

Dtypes: integer and bool inputs are promoted to float32
(`_validate.as_float`). The products of the dot-product family (`dot`,
`scaled_dot`, `inverse_dim`, `general`, `cosine`) are at least float32:
bfloat16 / float16 operands are multiplied with float32 accumulation and the
scores stay float32 into the (float32) softmax, since rounding a logit of
size L to bfloat16 moves it by up to L·2^-9 (0.4 at L = 200), which is the
regime this project studies (`_LOGITS_F32`). The other scores keep their
inputs' dtype. A feature axis of size 0 is a ValueError.
Inputs so large that `qᵀk` overflows (e.g. |q|, |k| ~ 1e30 in float32) give
inf scores; `attention` then returns NaN context for those rows, on every
implementation — scale such inputs first (or use `cosine`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_jax import _validate

__all__ = ["dot", "scaled_dot", "inverse_dim", "general", "additive", "additive_naive",
           "additive_projected", "cosine", "qk_norm", "qk_norm_init", "unit_vectors"]

# Elements of the [chunk, ..., Tk, a] tanh block kept live at once by
# `additive`; 2**22 float32 values = 16 MiB. Below this the whole tensor is
# formed directly, which is what XLA does best for small problems.
_ADDITIVE_BLOCK_ELEMENTS = 2 ** 22


def _check_qk(q, k, same_dim: bool):
  _validate.rank_at_least(q, "q", 2)
  _validate.rank_at_least(k, "k", 2)
  _validate.nonempty_axis(q, "q", -1, "feature")
  _validate.nonempty_axis(k, "k", -1, "feature")
  if same_dim:
    _validate.same_size(q.shape[-1], k.shape[-1], "q", "k", q.shape, k.shape)
  _validate.broadcast_shapes({"q (leading axes)": q.shape[:-2],
                              "k (leading axes)": k.shape[:-2]})


def _logits_dtype(*xs):
  """float32 for half-precision operands, else their promoted dtype (float64 stays)."""
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def _products(q: jax.Array, k: jax.Array) -> jax.Array:
  """`q kᵀ` accumulated and returned in `_logits_dtype` (float32 for bf16 / fp16)."""
  return jnp.matmul(q, jnp.swapaxes(k, -1, -2),
                    preferred_element_type=_logits_dtype(q, k))  # [..., Tq, Tk]


def dot(q: jax.Array, k: jax.Array) -> jax.Array:
  """Luong dot score `qᵀk`. q `[..., Tq, d]`, k `[..., Tk, d]` -> `[..., Tq, Tk]`,
  float32 for half-precision inputs (module docstring)."""
  q, k = _validate.as_float(q, "q"), _validate.as_float(k, "k")
  _check_qk(q, k, same_dim=True)
  return _products(q, k)  # [..., Tq, Tk]


def _scaled(q: jax.Array, k: jax.Array, scale: float) -> jax.Array:
  """`scale · qᵀk`. In float32 and wider the (smaller) query is scaled, which
  keeps the op count at Tq·d; in half precision the float32 products are, so
  that the scale is not rounded into the operands (1/√a is no power of two)."""
  if _logits_dtype(q, k) == jnp.result_type(q, k):
    return dot(q * jnp.asarray(scale, q.dtype), k)  # [..., Tq, Tk]
  out = dot(q, k)  # [..., Tq, Tk] float32
  return out * jnp.asarray(scale, out.dtype)


def scaled_dot(q: jax.Array, k: jax.Array) -> jax.Array:
  """Vaswani scaled dot `qᵀk / √d` with d = q.shape[-1]."""
  q = _validate.as_float(q, "q")
  _validate.rank_at_least(q, "q", 2)
  _validate.nonempty_axis(q, "q", -1, "feature")
  return _scaled(q, k, 1.0 / math.sqrt(q.shape[-1]))  # [..., Tq, Tk]


def inverse_dim(q: jax.Array, k: jax.Array) -> jax.Array:
  """μP attention score `qᵀk / d` (Yang et al. 2021, "Tensor Programs V",
  §4: divide by d, not √d), d = q.shape[-1]. Applied by the layers to the
  projected query and key (the `inverse_dim` arm: `⟨W_1 s + b_1, W_2 h + b_2⟩ / a`)."""
  q = _validate.as_float(q, "q")
  _validate.rank_at_least(q, "q", 2)
  _validate.nonempty_axis(q, "q", -1, "feature")
  return _scaled(q, k, 1.0 / q.shape[-1])  # [..., Tq, Tk]


def general(q: jax.Array, k: jax.Array, w: jax.Array) -> jax.Array:
  """Luong general (bilinear) score `q W kᵀ`, with `w [dq, dk]`."""
  q, k, w = (_validate.as_float(x, n) for x, n in ((q, "q"), (k, "k"), (w, "w")))
  _check_qk(q, k, same_dim=False)
  if w.ndim != 2 or w.shape != (q.shape[-1], k.shape[-1]):
    raise ValueError(
        f"`w` must have shape (dq, dk) = {(q.shape[-1], k.shape[-1])} for q "
        f"{tuple(q.shape)} and k {tuple(k.shape)}, got {tuple(w.shape)}.")
  return _products(q @ w, k)  # [..., Tq, Tk]


_ADDITIVE_ARGS = ("q", "k", "w_q", "w_k", "v")


def _check_additive(q, k, w_q, w_k, v):
  _check_qk(q, k, same_dim=False)
  for name, w, rows in (("w_q", w_q, q.shape[-1]), ("w_k", w_k, k.shape[-1])):
    if w.ndim != 2 or w.shape[0] != rows:
      raise ValueError(f"`{name}` must have shape ({rows}, a), got {tuple(w.shape)}.")
  if w_q.shape[1] != w_k.shape[1] or v.shape != (w_q.shape[1],):
    raise ValueError(
        "`w_q [dq, a]`, `w_k [dk, a]` and `v [a]` must share a: got "
        f"{tuple(w_q.shape)}, {tuple(w_k.shape)}, {tuple(v.shape)}.")


def additive_projected(q_proj: jax.Array, k_proj: jax.Array, v: jax.Array) -> jax.Array:
  """`vᵀ tanh(q_proj + k_proj)` for already projected queries and keys.

  `q_proj [..., Tq, a]`, `k_proj [..., Tk, a]`, `v [a]` -> `[..., Tq, Tk]`,
  formed in one `[..., Tq, Tk, a]` block (no chunking, no checks): the inner
  step of `additive`, for callers that project the keys once themselves.
  """
  hidden = jnp.tanh(q_proj[..., :, None, :] + k_proj[..., None, :, :])  # [..., n, Tk, a]
  return hidden @ v  # [..., n, Tk]


def additive_naive(q, k, w_q, w_k, v) -> jax.Array:
  """Additive score formed in one `[..., Tq, Tk, a]` tensor (the reference)."""
  q, k, w_q, w_k, v = (_validate.as_float(x, n) for x, n in zip((q, k, w_q, w_k, v), _ADDITIVE_ARGS))
  _check_additive(q, k, w_q, w_k, v)
  return additive_projected(q @ w_q, k @ w_k, v)  # [..., Tq, Tk]


def additive(q: jax.Array, k: jax.Array, w_q: jax.Array, w_k: jax.Array,
             v: jax.Array, *, block_elements: int | None = None) -> jax.Array:
  """Bahdanau additive score `vᵀ tanh(q W_q + k W_k)`.

  Args:
    q: `[..., Tq, dq]`.
    k: `[..., Tk, dk]`.
    w_q: `[dq, a]`.
    w_k: `[dk, a]`.
    v: `[a]`.
    block_elements: upper bound on the elements of the tanh block that is
      alive at once (default 2**22).

  Returns:
    `[..., Tq, Tk]` in the promoted dtype of the inputs.

  The `[..., Tq, Tk, a]` tanh tensor is the memory hog of this score. When it
  exceeds `block_elements`, queries are processed in chunks under
  `lax.map` + `jax.checkpoint`: the forward keeps one chunk's tanh block live,
  and the backward recomputes each chunk's block instead of storing all of
  them, so memory grows with `Tq·Tk` (the output) rather than `Tq·Tk·a`.
  """
  q, k, w_q, w_k, v = (_validate.as_float(x, n) for x, n in zip((q, k, w_q, w_k, v), _ADDITIVE_ARGS))
  _check_additive(q, k, w_q, w_k, v)
  budget = _ADDITIVE_BLOCK_ELEMENTS if block_elements is None else block_elements
  q_proj = q @ w_q  # [..., Tq, a]
  k_proj = k @ w_k  # [..., Tk, a]
  lead = jnp.broadcast_shapes(q_proj.shape[:-2], k_proj.shape[:-2])
  tq, tk, a = q_proj.shape[-2], k_proj.shape[-2], q_proj.shape[-1]
  per_query = math.prod(lead) * tk * a
  chunk = max(1, budget // max(per_query, 1))
  if chunk >= tq:
    return additive_projected(q_proj, k_proj, v)  # [..., Tq, Tk]

  q_proj = jnp.broadcast_to(q_proj, lead + (tq, a))
  k_proj = jnp.broadcast_to(k_proj, lead + (tk, a))
  n_chunks = -(-tq // chunk)
  pad = n_chunks * chunk - tq
  q_proj = jnp.pad(q_proj, [(0, 0)] * len(lead) + [(0, pad), (0, 0)])
  q_chunks = jnp.moveaxis(
      q_proj.reshape(lead + (n_chunks, chunk, a)), -3, 0)  # [C, ..., chunk, a]
  block = jax.checkpoint(lambda qc: additive_projected(qc, k_proj, v))
  out = jax.lax.map(block, q_chunks)  # [C, ..., chunk, Tk]
  out = jnp.moveaxis(out, 0, -3).reshape(lead + (n_chunks * chunk, tk))
  return out[..., :tq, :]  # [..., Tq, Tk]


def unit_vectors(x: jax.Array, eps: float = 1e-6) -> jax.Array:
  """`x / max(‖x‖, eps)` along the last axis, without overflow or underflow.

  The norm is taken of `x / max|x|` and scaled back, so a vector of norm 1e20
  (whose squares overflow float32) still comes out with unit norm; the sum of
  squares is accumulated in float32. A vector of norm below `eps` is divided
  by `eps`, so a zero vector stays zero and its gradient finite.
  """
  x32 = x.astype(jnp.float32)
  peak = jnp.max(jnp.abs(x32), axis=-1, keepdims=True)
  peak = jax.lax.stop_gradient(jnp.where(peak > 0, peak, 1.0))  # the norm is scale-equivariant
  sq = jnp.sum(jnp.square(x32 / peak), axis=-1, keepdims=True)  # >= 1 unless x = 0
  # peak · sqrt(max(sq, (eps/peak)²)) = max(‖x‖, eps), with no sqrt'(0) = inf
  # in the gradient of a zero vector.
  norm = peak * jnp.sqrt(jnp.maximum(sq, jnp.square(eps / peak)))
  return (x32 / norm).astype(x.dtype)


def cosine(q: jax.Array, k: jax.Array, beta=1.0) -> jax.Array:
  """Content-based (Graves NTM) score `β · qᵀk / (‖q‖‖k‖)`.

  `beta` is a scalar or an array broadcastable to the scores `[..., Tq, Tk]`
  (e.g. a per-query key strength `[..., Tq, 1]`). A zero vector has cosine 0
  with everything, and its gradient stays finite: norms are clamped at 1e-6
  rather than divided by exactly. Norms are computed scale-safely
  (`unit_vectors`): two parallel vectors of size 1e20 have cosine 1.
  """
  q, k = _validate.as_float(q, "q"), _validate.as_float(k, "k")
  _check_qk(q, k, same_dim=True)
  beta = _validate.as_float(beta, "beta")
  out_shape = _validate.broadcast_shapes({
      "q (leading axes)": q.shape[:-2], "k (leading axes)": k.shape[:-2]
  }) + (q.shape[-2], k.shape[-2])
  _validate.broadcast_shapes({"beta": beta.shape, "scores": out_shape})
  return beta.astype(q.dtype) * dot(unit_vectors(q), unit_vectors(k))  # [..., Tq, Tk]


def qk_norm(q: jax.Array, k: jax.Array, g) -> jax.Array:
  """QKNorm (Henry et al. 2020): `g · q̂ᵀk̂` with `x̂ = x / ‖x‖₂` along the
  feature axis and `g` a learnable scalar, used instead of the `1/√d` of
  scaled dot-product attention. The layers apply it to the projected query
  and key (`W_1 s + b_1`, `W_2 h + b_2`); `g` is initialised with
  `qk_norm_init`. Numerically it is `cosine` with `beta = g` (the same
  scale-safe normalisation); the two differ in where they sit (after the
  projections) and in how `g` starts.
  """
  return cosine(q, k, g)


def qk_norm_init(length: int) -> float:
  """Henry et al. 2020's initial `g`: `log₂(L² − L)`, L the longest sequence
  (they take the 97.5th percentile of the training lengths; the layers take
  the longest source they are built for). `L ≥ 2`."""
  if int(length) < 2:
    raise ValueError(f"`length` must be >= 2 for log2(L^2 - L), got {length!r}.")
  length = int(length)
  return math.log2(length * length - length)
