"""Blockwise (flash-style) dot-product attention for CPUs, with its own backward.

    scores  = scale · query keysᵀ             # [N, Tq, Tk], one tile at a time
    weights = softmax(scores | mask)          # float32
    context = weights values                  # [N, Tq, dv]

The plain path (`attention.attend`) materialises the float32 scores and
weights for every head at once and lets autodiff keep them for the backward;
at B = 8, H = 8, T = 512 that is 64 MiB per tensor, several passes of it go
through main memory, and XLA:CPU maps fresh pages for those buffers on every
call. Here the heads are processed in tiles of `[n heads, bq queries, Tk keys]`
of a few MiB (large enough for efficient matmuls), two independent tiles per
loop step, and a `jax.custom_vjp` backward recomputes each tile's weights from the
saved log-sum-exp instead of storing them (FlashAttention-2's scheme: memory
O(N·T·d) instead of O(N·Tq·Tk)).

Layout matters more than op count on XLA:CPU: a matmul that contracts over
the *first* axis of a large operand (`weightsᵀ @ grad_context`) runs at about
half the speed of the plain `[m, k] @ [k, n]` form. The backward therefore
recomputes the transposed scores `[Tk, bq]` directly, and every operand that
must be transposed (keys, queries, grad_context) is small (`[T, d]`) and is
transposed once, outside the tile loop. All seven matmuls of forward+backward
are then of the fast form.

Shape glossary: N flattened leading (batch × head) axes, Tq query length,
Tk key length, d query/key features, dv value features, n heads per tile,
bq queries per tile.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import _validate

__all__ = ["dot_product_attention", "tile_shape", "DEFAULT_TILE_ELEMENTS", "MAX_STREAMS"]

# Elements of one float32 `[n, bq, Tk]` score tile: 2**20 = 4 MiB, e.g. four
# heads of 512 x 512. Measured on a 2-core Xeon (B = H = 8, D = 64, forward +
# backward, wall clock): 2**20 was ~5-20% faster than 2**18 at T = 512 and
# 1024, and ~10% faster than 2**22.
DEFAULT_TILE_ELEMENTS = 2 ** 20
# Upper bound on the tiles issued concurrently per loop step (see `_map_streams`);
# each one is a copy of the tile program in the compiled HLO. Two streams on
# two cores were ~5-15% faster than one; more than two is untested on more cores.
MAX_STREAMS = 4


def tile_shape(num_heads: int, tq: int, tk: int,
               tile_elements: int = DEFAULT_TILE_ELEMENTS) -> tuple[int, int]:
  """Heads per tile `n` (a divisor of `num_heads`) and queries per tile `bq`.

  Whole query rows are preferred (fewer, larger matmuls); a row block is
  split only when one head's `[Tq, Tk]` scores exceed the budget, and heads
  are grouped only while the tile still fits.
  """
  for name, value in (("num_heads", num_heads), ("tq", tq), ("tk", tk),
                      ("tile_elements", tile_elements)):
    _validate.positive_int(value, name)
  bq = min(tq, max(8, tile_elements // tk))
  if bq < tq:
    bq = max(8, bq // 8 * 8)  # sublane-friendly multiple of 8
  per_head = bq * tk
  n = max(1, tile_elements // per_head)
  n = max(d for d in range(1, min(n, num_heads) + 1) if num_heads % d == 0)
  return n, bq


def _canonical_mask(mask, lead, tq, tk):
  """bool mask broadcastable to `lead + (Tq, Tk)` -> `[Nm, Tqm, Tk]`.

  Nm is 1 when the mask is the same for every head (e.g. causal), else N;
  Tqm is 1 when it does not depend on the query (e.g. key padding), else Tq.
  Only those compact forms are materialised, never `[N, Tq, Tk]` unless the
  mask really is that big.
  """
  mask = jnp.asarray(mask)
  shape = (1,) * (len(lead) + 2 - mask.ndim) + tuple(mask.shape)
  mask = mask.reshape(shape)
  per_head = any(s != 1 for s in shape[:-2])
  tqm = tq if shape[-2] != 1 else 1
  target = (lead if per_head else (1,) * len(lead)) + (tqm, tk)
  mask = jnp.broadcast_to(mask, target)
  return mask.reshape((-1, tqm, tk))  # [Nm, Tqm, Tk]


def _dot(a, b):
  """`a [..., m, k] @ b [..., k, n]` accumulated in float32."""
  return jnp.matmul(a, b, preferred_element_type=jnp.float32)


def _tile_forward(q_tile, k_t, v, mask_tile):
  # q_tile [n, bq, d] (already scaled), k_t [n, d, Tk], v [n, Tk, dv],
  # mask_tile [n or 1, bq or 1, Tk] or None.
  scores = _dot(q_tile, k_t)  # [n, bq, Tk]
  if mask_tile is None:
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    unnorm = jnp.exp(scores - row_max)  # [n, bq, Tk]
  else:
    row_max = jnp.max(jnp.where(mask_tile, scores, -jnp.inf), axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    unnorm = jnp.where(mask_tile, jnp.exp(scores - row_max), 0.0)  # [n, bq, Tk]
  total = jnp.sum(unnorm, axis=-1, keepdims=True)  # [n, bq, 1]
  context = _dot(unnorm.astype(v.dtype), v)  # [n, bq, dv]
  # A row with no valid key: zero context, and +inf log-sum-exp so that the
  # backward's exp(scores - lse) is exactly 0 there.
  valid = total > 0
  context = context / jnp.where(valid, total, 1.0)
  lse = jnp.where(valid, row_max + jnp.log(jnp.where(valid, total, 1.0)), jnp.inf)
  return context, lse[..., 0]  # [n, bq, dv] f32, [n, bq] f32


def _tile_backward(q_tile, q_tile_t, k, k_t, v, lse, delta, dout, dout_t, mask_tile_t):
  # Transposed layout throughout: key axis first, query axis last.
  # q_tile [n, bq, d], q_tile_t [n, d, bq], k [n, Tk, d], k_t [n, d, Tk],
  # v [n, Tk, dv], lse / delta [n, bq], dout [n, bq, dv], dout_t [n, dv, bq].
  scores_t = _dot(k, q_tile_t)  # [n, Tk, bq]
  weights_t = jnp.exp(scores_t - lse[:, None, :])  # [n, Tk, bq]
  if mask_tile_t is not None:
    weights_t = jnp.where(mask_tile_t, weights_t, 0.0)
  d_values = _dot(weights_t.astype(dout.dtype), dout)  # [n, Tk, dv]
  d_weights_t = _dot(v, dout_t)  # [n, Tk, bq]
  d_scores_t = weights_t * (d_weights_t - delta[:, None, :])  # [n, Tk, bq]
  d_scores_t = d_scores_t.astype(q_tile.dtype)
  d_keys = _dot(d_scores_t, q_tile)  # [n, Tk, d]
  d_query_t = _dot(k_t, d_scores_t)  # [n, d, bq]
  return d_query_t, d_keys, d_values


def _blocks(x, n, bq):
  """`[N, T, f]` (T a multiple of bq) -> `[N/n, T/bq, n, bq, f]`."""
  num, t, f = x.shape
  return x.reshape(num // n, n, t // bq, bq, f).transpose(0, 2, 1, 3, 4)


def _unblocks(x):
  """Inverse of `_blocks`: `[N/n, T/bq, n, bq, f]` -> `[N, T, f]`."""
  a, c, n, bq, f = x.shape
  return x.transpose(0, 2, 1, 3, 4).reshape(a * n, c * bq, f)


def _mask_blocks(mask, n, bq, num_heads):
  """`[Nm, Tqm, Tk]` -> `[Nm/n', Tqm/bq', n', bq', Tk]` with n' = n or 1, bq' = bq or 1."""
  nm, tqm, tk = mask.shape
  hn = n if nm == num_heads else 1
  qb = bq if tqm > 1 else 1
  return mask.reshape(nm // hn, hn, tqm // qb, qb, tk).transpose(0, 2, 1, 3, 4)


def _pick(blocked, i, j):
  """Tile (i, j) of a `_mask_blocks` array, indexing only non-broadcast axes."""
  return blocked[i if blocked.shape[0] > 1 else 0, j if blocked.shape[1] > 1 else 0]


def _map_streams(fn, length, streams):
  """`lax.map(fn, arange(length))` with `streams` independent calls per step.

  The calls inside one loop step share no data, so XLA:CPU's executor is free
  to run them concurrently on its thread pool. (A profile shows little
  overlap of the traced ops, yet wall clock improved by 5-15% on 2 cores at
  T = 512; the gain is measured, its mechanism not pinned down.)
  """
  if streams == 1 or length % streams:
    return jax.lax.map(fn, jnp.arange(length))
  def step(i):
    outs = [fn(i * streams + s) for s in range(streams)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
  out = jax.lax.map(step, jnp.arange(length // streams))
  return jax.tree.map(lambda x: x.reshape((length,) + x.shape[2:]), out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attention(query, keys, values, mask, n, bq, streams):
  return _forward(query, keys, values, mask, n, bq, streams)[0]


def _forward(query, keys, values, mask, n, bq, streams):
  # query [N, Tq', d] (scaled, Tq' a multiple of bq), keys [N, Tk, d],
  # values [N, Tk, dv], mask [Nm, Tqm', Tk] or None.
  num = query.shape[0]
  q_blocks = _blocks(query, n, bq)  # [N/n, Tq'/bq, n, bq, d]
  k_t = jnp.swapaxes(keys, -1, -2).reshape((num // n, n) + keys.shape[:0:-1])  # [N/n, n, d, Tk]
  v_heads = values.reshape((num // n, n) + values.shape[1:])  # [N/n, n, Tk, dv]
  m_blocks = None if mask is None else _mask_blocks(mask, n, bq, num)

  def head_chunk(i):
    def query_block(j):
      m = None if m_blocks is None else _pick(m_blocks, i, j)
      return _tile_forward(q_blocks[i, j], k_t[i], v_heads[i], m)
    if q_blocks.shape[1] == 1:  # whole rows in one tile: no inner loop to carry
      return jax.tree.map(lambda x: x[None], query_block(0))
    return jax.lax.map(query_block, jnp.arange(q_blocks.shape[1]))

  context, lse = _map_streams(head_chunk, q_blocks.shape[0], streams)
  context = _unblocks(context).astype(values.dtype)  # [N, Tq', dv]
  lse = _unblocks(lse[..., None])[..., 0]  # [N, Tq']
  return context, (query, keys, values, mask, context, lse)


def _backward(n, bq, streams, residuals, d_context):
  query, keys, values, mask, context, lse = residuals
  num, _, d = query.shape
  tk, dv = values.shape[1], values.shape[2]
  d_context = d_context.astype(values.dtype)
  # delta_i = Σ_j weights_ij d_weights_ij = d_context_i · context_i.
  delta = jnp.sum(d_context.astype(jnp.float32) * context.astype(jnp.float32), -1)  # [N, Tq']
  q_blocks = _blocks(query, n, bq)  # [N/n, Tq'/bq, n, bq, d]
  q_blocks_t = jnp.swapaxes(q_blocks, -1, -2)  # [N/n, Tq'/bq, n, d, bq]
  do_blocks = _blocks(d_context, n, bq)  # [N/n, Tq'/bq, n, bq, dv]
  do_blocks_t = jnp.swapaxes(do_blocks, -1, -2)  # [N/n, Tq'/bq, n, dv, bq]
  lse_blocks = _blocks(lse[..., None], n, bq)[..., 0]  # [N/n, Tq'/bq, n, bq]
  delta_blocks = _blocks(delta[..., None], n, bq)[..., 0]
  k_heads = keys.reshape(num // n, n, tk, d)
  k_t = jnp.swapaxes(k_heads, -1, -2)  # [N/n, n, d, Tk]
  v_heads = values.reshape(num // n, n, tk, dv)
  m_blocks_t = (None if mask is None
                else jnp.swapaxes(_mask_blocks(mask, n, bq, num), -1, -2))

  def head_chunk(i):
    def query_block(carry, j):
      d_keys, d_values = carry
      m = None if m_blocks_t is None else _pick(m_blocks_t, i, j)
      dq_t, dk, dv_ = _tile_backward(
          q_blocks[i, j], q_blocks_t[i, j], k_heads[i], k_t[i], v_heads[i],
          lse_blocks[i, j], delta_blocks[i, j], do_blocks[i, j],
          do_blocks_t[i, j], m)
      return (d_keys + dk, d_values + dv_), dq_t

    if q_blocks.shape[1] == 1:
      m = None if m_blocks_t is None else _pick(m_blocks_t, i, 0)
      dq_t, d_keys, d_values = _tile_backward(
          q_blocks[i, 0], q_blocks_t[i, 0], k_heads[i], k_t[i], v_heads[i],
          lse_blocks[i, 0], delta_blocks[i, 0], do_blocks[i, 0], do_blocks_t[i, 0], m)
      return dq_t[None], d_keys, d_values
    init = (jnp.zeros((n, tk, d), jnp.float32), jnp.zeros((n, tk, dv), jnp.float32))
    (d_keys, d_values), dq_t = jax.lax.scan(query_block, init,
                                            jnp.arange(q_blocks.shape[1]))
    return dq_t, d_keys, d_values

  dq_t, d_keys, d_values = _map_streams(head_chunk, q_blocks.shape[0], streams)
  d_query = _unblocks(jnp.swapaxes(dq_t, -1, -2))  # [N, Tq', d]
  d_mask = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)
  return (d_query.astype(query.dtype), d_keys.reshape(keys.shape).astype(keys.dtype),
          d_values.reshape(values.shape).astype(values.dtype), d_mask)


_attention.defvjp(_forward, _backward)


def dot_product_attention(query: jax.Array, keys: jax.Array, values: jax.Array,
                          mask: jax.Array | None = None, *, scale: float | None = None,
                          tile_elements: int = DEFAULT_TILE_ELEMENTS,
                          streams: int | None = None) -> jax.Array:
  """`softmax(scale · query keysᵀ | mask) values`, computed tile by tile.

  Args:
    query: `[..., Tq, d]`.
    keys: `[..., Tk, d]`; leading axes broadcast with `query` and `values`.
    values: `[..., Tk, dv]`.
    mask: optional bool broadcastable to `[..., Tq, Tk]`; True = may attend.
      A query row with no valid key gets a zero context (as in `attend`).
    scale: multiplies the scores; default `1/√d`.
    tile_elements: score elements per tile (see `tile_shape`).
    streams: independent tiles issued per loop step (default: the number of
      CPU cores available to the process, at most `MAX_STREAMS`).

  Returns:
    context `[..., Tq, dv]` in the values' dtype. Softmax statistics and
    matmul accumulation are float32 for every input dtype. Differentiable in
    query, keys and values; the backward recomputes each tile's weights.
  """
  query, keys, values = map(jnp.asarray, (query, keys, values))
  for name, x in (("query", query), ("keys", keys), ("values", values)):
    _validate.rank_at_least(x, name, 2)
  _validate.same_size(query.shape[-1], keys.shape[-1], "query", "keys",
                      query.shape, keys.shape)
  _validate.same_size(keys.shape[-2], values.shape[-2], "keys (Tk axis)",
                      "values (Tk axis)", keys.shape, values.shape)
  lead = _validate.broadcast_shapes({"query (leading axes)": query.shape[:-2],
                                     "keys (leading axes)": keys.shape[:-2],
                                     "values (leading axes)": values.shape[:-2]})
  tq, tk, d, dv = query.shape[-2], keys.shape[-2], query.shape[-1], values.shape[-1]
  mask = _validate.mask_within(mask, lead + (tq, tk))
  dtype = jnp.result_type(query, keys, values)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"query, keys and values must be floating point, got {dtype}.")
  num = math.prod(lead)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)

  def flat(x, f):
    return jnp.broadcast_to(x, lead + x.shape[-2:]).reshape(num, x.shape[-2], f).astype(dtype)

  # Scaling the [T, d] query rather than every score tile.
  q = flat(query, d) * jnp.asarray(scale, dtype)  # [N, Tq, d]
  k, v = flat(keys, d), flat(values, dv)  # [N, Tk, d], [N, Tk, dv]
  n, bq = tile_shape(num, tq, tk, tile_elements)
  if streams is None:
    streams = max(1, min(MAX_STREAMS, len(os.sched_getaffinity(0))))
  streams = _validate.positive_int(streams, "streams")
  pad = -tq % bq
  if pad:  # padded query rows are computed and dropped; they get zero gradient.
    q = jnp.pad(q, ((0, 0), (0, pad), (0, 0)))
  m = None
  if mask is not None:
    m = _canonical_mask(mask, lead, tq, tk)  # [Nm, Tqm, Tk]
    if pad and m.shape[1] > 1:
      m = jnp.pad(m, ((0, 0), (0, pad), (0, 0)), constant_values=True)
  context = _attention(q, k, v, m, n, bq, streams)[:, :tq]  # [N, Tq, dv]
  return context.reshape(lead + (tq, dv))
