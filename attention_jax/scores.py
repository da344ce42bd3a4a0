"""Attention score functions f(query, key) -> scores (SPEC.md §3).

Pure JAX: no parameters are created here, weights are passed in. Every
function maps

  query `q [..., Tq, dq]`, keys `k [..., Tk, dk]`  ->  scores `[..., Tq, Tk]`

with the leading (batch, head, ...) axes broadcast against each other.

Shape glossary: Tq query length, Tk key length, dq / dk feature sizes,
a attention (projection) dimension.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_jax import _validate

__all__ = ["dot", "scaled_dot", "general", "additive", "additive_naive",
           "cosine", "SCORE_NAMES"]

SCORE_NAMES = ("dot", "scaled_dot", "general", "additive", "cosine")

# Elements of the [chunk, ..., Tk, a] tanh block kept live at once by
# `additive`; 2**22 float32 values = 16 MiB. Below this the whole tensor is
# formed directly, which is what XLA does best for small problems.
_ADDITIVE_BLOCK_ELEMENTS = 2 ** 22


def _check_qk(q, k, same_dim: bool):
  _validate.rank_at_least(q, "q", 2)
  _validate.rank_at_least(k, "k", 2)
  if same_dim:
    _validate.same_size(q.shape[-1], k.shape[-1], "q", "k", q.shape, k.shape)
  _validate.broadcast_shapes({"q (leading axes)": q.shape[:-2],
                              "k (leading axes)": k.shape[:-2]})


def dot(q: jax.Array, k: jax.Array) -> jax.Array:
  """Luong dot score `qᵀk`. q `[..., Tq, d]`, k `[..., Tk, d]` -> `[..., Tq, Tk]`."""
  q, k = jnp.asarray(q), jnp.asarray(k)
  _check_qk(q, k, same_dim=True)
  return jnp.matmul(q, jnp.swapaxes(k, -1, -2))  # [..., Tq, Tk]


def scaled_dot(q: jax.Array, k: jax.Array) -> jax.Array:
  """Vaswani scaled dot `qᵀk / √d` with d = q.shape[-1]."""
  q = jnp.asarray(q)
  scale = 1.0 / math.sqrt(q.shape[-1]) if q.ndim else 1.0
  # Scaling the (smaller) query instead of the scores keeps the op count at Tq·d.
  return dot(q * jnp.asarray(scale, q.dtype), k)  # [..., Tq, Tk]


def general(q: jax.Array, k: jax.Array, w: jax.Array) -> jax.Array:
  """Luong general (bilinear) score `q W kᵀ`, with `w [dq, dk]`."""
  q, k, w = jnp.asarray(q), jnp.asarray(k), jnp.asarray(w)
  _check_qk(q, k, same_dim=False)
  if w.ndim != 2 or w.shape != (q.shape[-1], k.shape[-1]):
    raise ValueError(
        f"`w` must have shape (dq, dk) = {(q.shape[-1], k.shape[-1])} for q "
        f"{tuple(q.shape)} and k {tuple(k.shape)}, got {tuple(w.shape)}.")
  return jnp.matmul(q @ w, jnp.swapaxes(k, -1, -2))  # [..., Tq, Tk]


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
  q, k, w_q, w_k, v = map(jnp.asarray, (q, k, w_q, w_k, v))
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
  q, k, w_q, w_k, v = map(jnp.asarray, (q, k, w_q, w_k, v))
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


def cosine(q: jax.Array, k: jax.Array, beta=1.0) -> jax.Array:
  """Content-based (Graves NTM) score `β · qᵀk / (‖q‖‖k‖)`.

  `beta` is a scalar or an array broadcastable to the scores `[..., Tq, Tk]`
  (e.g. a per-query key strength `[..., Tq, 1]`). A zero vector has cosine 0
  with everything, and its gradient stays finite: norms are clamped at 1e-6
  rather than divided by exactly.
  """
  q, k = jnp.asarray(q), jnp.asarray(k)
  _check_qk(q, k, same_dim=True)
  beta = jnp.asarray(beta)
  out_shape = _validate.broadcast_shapes({
      "q (leading axes)": q.shape[:-2], "k (leading axes)": k.shape[:-2]
  }) + (q.shape[-2], k.shape[-2])
  _validate.broadcast_shapes({"beta": beta.shape, "scores": out_shape})
  eps = 1e-6

  def unit(x):
    sq = jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(jnp.maximum(sq, eps * eps)).astype(x.dtype))

  return beta.astype(q.dtype) * dot(unit(q), unit(k))  # [..., Tq, Tk]
