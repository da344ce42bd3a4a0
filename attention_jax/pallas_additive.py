"""Additive (Bahdanau) attention as fused Pallas kernels, forward and backward.

    q' = query W_q, k' = keys W_k                      # [N, T, a]: XLA matmuls
    s_ij = Σ_c v_c tanh(q'_ic + k'_jc)                 # one tile at a time, never stored
    weights = softmax_j(s | mask)                      # float32, online over key blocks
    context = weights values                           # [N, Tq, dv]

Why: the additive score's `[N, Tq, Tk, a]` tanh block is what makes it
expensive. XLA's naive form stores it for the backward (137.8 GB at B = 32,
T = 1024, a = 1024 on an H100 target; results/compile_check/pallas_additive);
`scores.additive` bounds that with `lax.map` over query chunks under
`jax.checkpoint`, at the price of many small programs and `[N, Tq, Tk]`
float32 scores and weights in memory. These
kernels hold one `[rows, cols, chunk]` tile of the tanh block at a time: the
forward keeps a running max, normaliser and context per query row over the
key blocks (FlashAttention's online softmax), the score tile is summed one
chunk of `a` at a time, and the backward recomputes each tile's tanh and
weights from the saved log-sum-exp (FlashAttention-2's scheme). Memory is
O(N·T·a) for the projections and nothing of size Tq·Tk.

Three kernels, each with a `(N, blocks)` grid of independent programs:
- forward, one query block per program, a loop over the key blocks;
- `dq`, the same layout, the gradient of the projected queries;
- `dkv`, one key block per program, a loop over the query blocks: the
  gradients of the projected keys, the values and (as per-block partial sums)
  `v`. It computes the transposed tiles (keys as rows), which the score's
  form `tanh(q'_i + k'_j)` allows without a transpose in the kernel.

Layout: `a` is cut into chunks of `chunk` features and the chunk index is a
leading axis (`[N, C, T, chunk]`), so that a kernel picks a chunk by a
dynamic index on an untiled axis, which both Mosaic (TPU) and Triton (GPU)
lower; rows sit on sublanes and columns on lanes of every tile.

Softmax statistics, score sums and matmul accumulation are float32 for every
input dtype (bfloat16 projections are computed with float32 accumulation and
kept in float32). A query row with no valid key gets a zero context, and
+inf as its log-sum-exp, so that the backward's `exp(s - lse)` is exactly 0
there: zero weights and zero, finite gradients, as `attention.attend` gives.

Shape glossary: N flattened leading (batch × head) axes, Tq / Tk query / key
lengths, a attention dimension, C = a / chunk, dv value size.

On a CPU the kernels run only in Pallas's interpret mode (slow: for tests);
`attention(implementation='auto')` never picks them there.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
import numpy as np

from attention_jax import _validate
from attention_jax import blockwise

__all__ = ["additive_attention", "additive_attention_projected", "Blocks", "default_blocks",
           "cost_estimates", "tpu_vmem_bytes", "TPU_VMEM_LIMIT_BYTES"]

# The most VMEM a kernel may ask Mosaic for on a TPU (v5e has 128 MiB per
# core; Mosaic's default scoped limit is 16 MiB, which the kernels exceed at
# a = 1024 from a few hundred keys on, since they keep one head's projected
# keys, or queries, whole in VMEM). What is left is for Mosaic's own scratch.
TPU_VMEM_LIMIT_BYTES = 100 * 2 ** 20


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes: `rows` (on sublanes: queries in the forward and `dq`
  kernels, keys in `dkv`), `cols` (on lanes: the other side), `chunk` (the
  features of `a` in one tanh tile). The tanh tile is `rows × cols × chunk`."""
  rows: int
  cols: int
  chunk: int

  def __post_init__(self):
    for name in ("rows", "cols", "chunk"):
      _validate.positive_int(getattr(self, name), name)


def default_blocks(platform: str) -> Blocks:
  """Tile sizes per platform. TPU: a lane-dense `[8, 128]` score tile and
  128-wide chunks (Mosaic slices lanes at multiples of 128; a 512 KiB tanh
  tile). GPU (Triton): powers of two of at least 16 (its `dot` needs them),
  `16 × 16 × 32`, 8k float32 values, 64 per thread of 4 warps. Interpret
  mode (CPU): small tiles. None of them is tuned: no device has timed them."""
  if platform == "tpu":
    return Blocks(8, 128, 128)
  if platform == "gpu":
    return Blocks(16, 16, 32)
  return Blocks(8, 8, 8)


def _platform() -> str:
  """'tpu', 'gpu' or 'cpu': what `jax.default_backend()` says (the compile
  check makes it answer the target's platform while it traces)."""
  backend = jax.default_backend()
  return backend if backend in ("tpu", "gpu") else "cpu"


@dataclasses.dataclass(frozen=True)
class _Config:
  """Everything static about one call (hashable: a `nondiff_argnum`)."""
  blocks: Blocks
  tq: int  # padded query length
  tk: int  # padded key length
  valid_keys: int  # the real Tk; keys at or after it are padding
  platform: str
  interpret: bool
  masked: bool
  mask_per_query: bool  # the mask has a query axis (else [Nm, 1, Tk])
  mask_per_head: bool  # the mask differs along N (else [1, Tqm, Tk])


def _dot(a, b, contract_b: int):
  """`a [m, k] @ b` (b `[k, n]` with `contract_b` 0, `[n, k]` with 1),
  accumulated in float32; float32 operands at full precision (a TPU's and
  Triton's defaults round float32 operands to bfloat16 / tf32)."""
  precision = (jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 and b.dtype == jnp.float32
               else None)
  return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------
# Kernel bodies (refs: Pallas blocks; shapes given without the squeezed N axis).


def _tile_scores(rows_ref, cols_ref, v_ref, start, cols: int, chunks: int):
  """`s[r, c] = Σ_f v_f tanh(rows[r, f] + cols[start + c, f])`, float32
  `[R, cols]`, one chunk of features at a time.

  rows_ref `[C, R, chunk]`, cols_ref `[C, T, chunk]`, v_ref `[C, 1, chunk]`.
  """
  def chunk(f, acc):
    x = rows_ref[f].astype(jnp.float32)  # [R, chunk]
    y = cols_ref[f, pl.ds(start, cols), :].astype(jnp.float32)  # [cols, chunk]
    w = v_ref[f].astype(jnp.float32)  # [1, chunk]
    hidden = jnp.tanh(x[:, None, :] + y[None, :, :])  # [R, cols, chunk]
    return acc + jnp.sum(hidden * w[None], axis=-1)  # [R, cols]

  init = jnp.zeros((rows_ref.shape[1], cols), jnp.float32)
  return jax.lax.fori_loop(0, chunks, chunk, init)


def _tile_gradients(rows_ref, cols_ref, v_ref, start, cols: int, chunks: int, d_scores,
                    d_rows_ref, d_v_ref=None):
  """Adds the tile's share of the gradients, with `g = ds · (1 - tanh²)`:
  `d_rows[f] += v_f Σ_c g[:, c, f]` and, if `d_v_ref` is given,
  `d_v[f] += Σ_{r, c} ds · tanh`. `d_scores` float32 `[R, cols]`."""
  def chunk(f, carry):
    x = rows_ref[f].astype(jnp.float32)  # [R, chunk]
    y = cols_ref[f, pl.ds(start, cols), :].astype(jnp.float32)  # [cols, chunk]
    w = v_ref[f].astype(jnp.float32)  # [1, chunk]
    hidden = jnp.tanh(x[:, None, :] + y[None, :, :])  # [R, cols, chunk]
    ds = d_scores[:, :, None]  # [R, cols, 1]
    d_rows_ref[f] += w * jnp.sum(ds * (1.0 - hidden * hidden), axis=1)  # [R, chunk]
    if d_v_ref is not None:
      d_v_ref[f] += jnp.sum(jnp.sum(ds * hidden, axis=0), axis=0, keepdims=True)  # [1, chunk]
    return carry

  jax.lax.fori_loop(0, chunks, chunk, 0)


def _valid(cfg: _Config, mask_ref, row_start, col_start, rows: int, cols: int,
           keys_on_rows: bool):
  """bool `[R or 1, cols]` (or `[R, cols]`): may row r attend column c of
  this tile. Padding keys (at or after `cfg.valid_keys`) never may; the
  mask block is `[R or 1, T]` with the columns' axis last."""
  if keys_on_rows:
    key = row_start + jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0)
  else:
    key = col_start + jax.lax.broadcasted_iota(jnp.int32, (1, cols), 1)
  ok = key < cfg.valid_keys
  if mask_ref is not None:
    ok = jnp.logical_and(ok, mask_ref[:, pl.ds(col_start, cols)] != 0)
  return ok


def _forward_kernel(q_ref, k_ref, values_ref, v_ref, *refs, cfg: _Config, chunks: int):
  # q_ref [C, R, chunk] (this program's queries), k_ref [C, Tk, chunk],
  # values_ref [Tk, dv], v_ref [C, 1, chunk], mask_ref [R or 1, Tk];
  # out_ref [R, dv], lse_ref [R, 1].
  mask_ref, out_ref, lse_ref = refs if cfg.masked else (None,) + refs
  rows, cols = cfg.blocks.rows, cfg.blocks.cols
  dv = values_ref.shape[-1]

  def key_block(j, carry):
    m_prev, l_prev, acc = carry
    start = pl.multiple_of(j * cols, cols)
    s = _tile_scores(q_ref, k_ref, v_ref, start, cols, chunks)  # [R, cols]
    ok = _valid(cfg, mask_ref, 0, start, rows, cols, keys_on_rows=False)
    s = jnp.where(ok, s, -jnp.inf)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))  # [R, 1]
    # A row with no valid key so far keeps -inf; 0 stands in, so that no
    # inf - inf appears (exp(-inf - 0) = 0 for its masked logits).
    m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
    p = jnp.where(ok, jnp.exp(s - m_safe), 0.0)  # [R, cols]
    scale = jnp.exp(m_prev - m_safe)  # [R, 1]; 0 while m_prev is -inf
    values = values_ref[pl.ds(start, cols), :]
    acc = scale * acc + _dot(p.astype(values.dtype), values, 0)  # [R, dv]
    return m_next, scale * l_prev + jnp.sum(p, axis=-1, keepdims=True), acc

  init = (jnp.full((rows, 1), -jnp.inf, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
          jnp.zeros((rows, dv), jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, cfg.tk // cols, key_block, init)
  has_keys = l > 0
  total = jnp.where(has_keys, l, 1.0)
  out_ref[...] = (acc / total).astype(out_ref.dtype)
  lse_ref[...] = jnp.where(has_keys, m + jnp.log(total), jnp.inf)


def _dq_kernel(q_ref, k_ref, values_ref, v_ref, *refs, cfg: _Config, chunks: int):
  # As the forward, plus lse_ref / delta_ref [R, 1], d_out_ref [R, dv];
  # out: dq_ref [C, R, chunk] float32.
  mask_ref, lse_ref, delta_ref, d_out_ref, dq_ref = refs if cfg.masked else (None,) + refs
  rows, cols = cfg.blocks.rows, cfg.blocks.cols
  dq_ref[...] = jnp.zeros(dq_ref.shape, dq_ref.dtype)
  lse, delta, d_out = lse_ref[...], delta_ref[...], d_out_ref[...]

  def key_block(j, carry):
    start = pl.multiple_of(j * cols, cols)
    s = _tile_scores(q_ref, k_ref, v_ref, start, cols, chunks)  # [R, cols]
    ok = _valid(cfg, mask_ref, 0, start, rows, cols, keys_on_rows=False)
    p = jnp.where(ok, jnp.exp(s - lse), 0.0)  # the weights; 0 where lse = +inf
    d_p = _dot(d_out, values_ref[pl.ds(start, cols), :], 1)  # [R, cols]
    _tile_gradients(q_ref, k_ref, v_ref, start, cols, chunks, p * (d_p - delta), dq_ref)
    return carry

  jax.lax.fori_loop(0, cfg.tk // cols, key_block, 0)


def _dkv_kernel(k_ref, q_ref, values_ref, v_ref, *refs, cfg: _Config, chunks: int):
  # Transposed: this program's keys are the rows. k_ref [C, R, chunk],
  # q_ref [C, Tq, chunk], values_ref [R, dv], v_ref [C, 1, chunk],
  # mask_ref [R, Tq or 1] (the transposed mask), lse_ref / delta_ref [1, Tq],
  # d_out_ref [Tq, dv]; out: dk_ref [C, R, chunk], d_values_ref [R, dv],
  # dv_ref [C, 1, chunk] (this key block's share of v's gradient), float32.
  mask_ref, lse_ref, delta_ref, d_out_ref, dk_ref, d_values_ref, dv_ref = (
      refs if cfg.masked else (None,) + refs)
  rows, cols = cfg.blocks.rows, cfg.blocks.cols
  for ref in (dk_ref, d_values_ref, dv_ref):
    ref[...] = jnp.zeros(ref.shape, ref.dtype)
  row_start = pl.program_id(1) * rows
  values = values_ref[...]  # [R, dv]

  def query_block(i, carry):
    start = pl.multiple_of(i * cols, cols)
    s_t = _tile_scores(k_ref, q_ref, v_ref, start, cols, chunks)  # [R keys, cols queries]
    ok = _valid(cfg, None, row_start, start, rows, cols, keys_on_rows=True)
    if mask_ref is not None:
      m = mask_ref[:, pl.ds(start, cols)] if cfg.mask_per_query else mask_ref[...]
      ok = jnp.logical_and(ok, m != 0)
    p_t = jnp.where(ok, jnp.exp(s_t - lse_ref[:, pl.ds(start, cols)]), 0.0)  # [R, cols]
    d_out = d_out_ref[pl.ds(start, cols), :]  # [cols, dv]
    d_values_ref[...] += _dot(p_t.astype(d_out.dtype), d_out, 0)  # [R, dv]
    d_p_t = _dot(values, d_out, 1)  # [R, cols]
    d_s_t = p_t * (d_p_t - delta_ref[:, pl.ds(start, cols)])
    _tile_gradients(k_ref, q_ref, v_ref, start, cols, chunks, d_s_t, dk_ref, dv_ref)
    return carry

  jax.lax.fori_loop(0, cfg.tq // cols, query_block, 0)


# ----------------------------------------------------------------------------
# Costs and TPU memory (pure).


def cost_estimates(n: int, tq: int, tk: int, a: int, dv: int, itemsize: int = 4,
                   mask_bytes: int = 0) -> dict[str, dict[str, int]]:
  """`{'forward' | 'dq' | 'dkv': {flops, transcendentals, bytes_accessed}}`
  of the three kernels at these (padded) sizes, for `pl.CostEstimate`.

  Per (query, key, feature): the forward adds, takes tanh, multiplies by v
  and sums (3 FLOPs, 1 tanh); each backward kernel recomputes that and then
  forms `ds · (1 - h²)` and sums it (4 more), `dkv` also `ds · h` summed
  (2 more). Per (query, key): the softmax (~5) and one exp, and `2·dv` per
  matmul with the values (one in the forward and `dq`, two in `dkv`).
  Bytes: every operand and result once (the kernels keep one head's keys or
  queries in fast memory while they loop over them).
  """
  pairs = n * tq * tk
  proj = n * (tq + tk) * a * itemsize
  vals = n * tk * dv * itemsize
  rows_out = n * tq * dv * itemsize
  stats = n * tq * 4
  return {
      "forward": dict(flops=pairs * (3 * a + 2 * dv + 5), transcendentals=pairs * (a + 1),
                      bytes_accessed=proj + vals + rows_out + stats + mask_bytes),
      "dq": dict(flops=pairs * (7 * a + 2 * dv + 5), transcendentals=pairs * (2 * a + 1),
                 bytes_accessed=proj + vals + rows_out + 2 * stats + n * tq * a * 4
                 + mask_bytes),
      "dkv": dict(flops=pairs * (9 * a + 4 * dv + 5), transcendentals=pairs * (2 * a + 1),
                  bytes_accessed=proj + vals + rows_out + 2 * stats
                  + n * tk * (a + dv) * 4 + mask_bytes),
  }


def _tile_bytes(shape, itemsize: int = 4) -> int:
  """VMEM bytes of a block on a TPU: the last two axes padded to (8, 128) tiles."""
  *lead, sub, lane = (1,) * max(0, 2 - len(shape)) + tuple(shape)
  return math.prod(lead) * (-(-sub // 8) * 8) * (-(-lane // 128) * 128) * itemsize


def tpu_vmem_bytes(tq: int, tk: int, a: int, dv: int, blocks: Blocks, masked: bool = True,
                   itemsize: int = 4) -> int:
  """The most VMEM one of the kernels needs on a TPU (bytes): its blocks,
  double-buffered as Mosaic's pipeline holds them, and its tanh tile a few
  times over. The whole projected keys (forward, `dq`) or queries (`dkv`) of
  one head are one block, so this grows with `T·a`."""
  r, c, f = blocks.rows, blocks.cols, blocks.chunk
  chunks = -(-a // f)
  tile = 4 * _tile_bytes((r * c, f))  # the tanh tile and its products
  fwd = (_tile_bytes((chunks, r, f), itemsize) + _tile_bytes((chunks, tk, f), itemsize)
         + _tile_bytes((tk, dv), itemsize) + _tile_bytes((chunks, 1, f))
         + (_tile_bytes((r, tk)) if masked else 0) + _tile_bytes((r, dv)) + _tile_bytes((r, 1)))
  dq = fwd + _tile_bytes((r, dv), itemsize) + 2 * _tile_bytes((r, 1)) + _tile_bytes((chunks, r, f))
  dkv = (_tile_bytes((chunks, r, f), itemsize) + _tile_bytes((chunks, tq, f), itemsize)
         + _tile_bytes((r, dv), itemsize) + _tile_bytes((chunks, 1, f))
         + (_tile_bytes((r, tq)) if masked else 0) + 2 * _tile_bytes((1, tq))
         + _tile_bytes((tq, dv), itemsize) + _tile_bytes((chunks, r, f)) + _tile_bytes((r, dv))
         + _tile_bytes((chunks, 1, f)))
  return 2 * max(fwd, dq, dkv) + tile


# ----------------------------------------------------------------------------
# pallas_call wrappers.


def _compiler_params(cfg: _Config, vmem_bytes: int):
  if cfg.interpret:
    return None
  if cfg.platform == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                vmem_limit_bytes=int(vmem_bytes))
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top
  return pltriton.CompilerParams(num_warps=4, num_stages=2)


def _spec(block, index):
  """A BlockSpec with the leading N axis squeezed (`None` in `block`)."""
  return pl.BlockSpec(block, index)


def _call(kernel, cfg: _Config, grid, in_specs, out_specs, out_shape, cost: dict,
          vmem_bytes: int, name: str):
  return pl.pallas_call(
      kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      interpret=cfg.interpret, compiler_params=_compiler_params(cfg, vmem_bytes),
      cost_estimate=pl.CostEstimate(**cost), name=name)


def _mask_spec(cfg: _Config, rows: int, transposed: bool):
  """The mask's BlockSpec: `[Nm, Tqm, Tk]` blocks `[R or 1, Tk]` by query
  block, or transposed `[Nm, Tk, Tqm]` blocks `[R, Tqm]` by key block."""
  head = (lambda n: n) if cfg.mask_per_head else (lambda n: 0)
  if transposed:
    width = cfg.tq if cfg.mask_per_query else 1
    return _spec((None, rows, width), lambda n, j: (head(n), j, 0))
  if cfg.mask_per_query:
    return _spec((None, rows, cfg.tk), lambda n, i: (head(n), i, 0))
  return _spec((None, 1, cfg.tk), lambda n, i: (head(n), 0, 0))


def _sizes(q, values):
  n, chunks, _, chunk = q.shape
  return n, chunks, chunk, values.shape[-1]


def _forward_call(cfg: _Config, q, k, values, v, mask):
  n, chunks, chunk, dv = _sizes(q, values)
  r = cfg.blocks.rows
  in_specs = [_spec((None, chunks, r, chunk), lambda n, i: (n, 0, i, 0)),
              _spec((None, chunks, cfg.tk, chunk), lambda n, i: (n, 0, 0, 0)),
              _spec((None, cfg.tk, dv), lambda n, i: (n, 0, 0)),
              _spec((None, chunks, 1, chunk), lambda n, i: (n, 0, 0, 0))]
  args = [q, k, values, v]
  if cfg.masked:
    in_specs.append(_mask_spec(cfg, r, transposed=False))
    args.append(mask)
  out_shape = (jax.ShapeDtypeStruct((n, cfg.tq, dv), values.dtype),
               jax.ShapeDtypeStruct((n, cfg.tq, 1), jnp.float32))
  out_specs = (_spec((None, r, dv), lambda n, i: (n, i, 0)),
               _spec((None, r, 1), lambda n, i: (n, i, 0)))
  cost = _costs(cfg, q, values, mask)["forward"]
  kernel = functools.partial(_forward_kernel, cfg=cfg, chunks=chunks)
  return _call(kernel, cfg, (n, cfg.tq // r), in_specs, out_specs, out_shape, cost,
               _vmem(cfg, q, values), "additive_attention_fwd")(*args)


def _dq_call(cfg: _Config, q, k, values, v, mask, lse, delta, d_out):
  n, chunks, chunk, dv = _sizes(q, values)
  r = cfg.blocks.rows
  in_specs = [_spec((None, chunks, r, chunk), lambda n, i: (n, 0, i, 0)),
              _spec((None, chunks, cfg.tk, chunk), lambda n, i: (n, 0, 0, 0)),
              _spec((None, cfg.tk, dv), lambda n, i: (n, 0, 0)),
              _spec((None, chunks, 1, chunk), lambda n, i: (n, 0, 0, 0))]
  args = [q, k, values, v]
  if cfg.masked:
    in_specs.append(_mask_spec(cfg, r, transposed=False))
    args.append(mask)
  in_specs += [_spec((None, r, 1), lambda n, i: (n, i, 0)),
               _spec((None, r, 1), lambda n, i: (n, i, 0)),
               _spec((None, r, dv), lambda n, i: (n, i, 0))]
  args += [lse, delta, d_out]
  out_shape = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  out_specs = _spec((None, chunks, r, chunk), lambda n, i: (n, 0, i, 0))
  cost = _costs(cfg, q, values, mask)["dq"]
  kernel = functools.partial(_dq_kernel, cfg=cfg, chunks=chunks)
  return _call(kernel, cfg, (n, cfg.tq // r), in_specs, out_specs, out_shape, cost,
               _vmem(cfg, q, values), "additive_attention_dq")(*args)


def _dkv_call(cfg: _Config, q, k, values, v, mask_t, lse_t, delta_t, d_out):
  n, chunks, chunk, dv = _sizes(q, values)
  r = cfg.blocks.rows
  in_specs = [_spec((None, chunks, r, chunk), lambda n, j: (n, 0, j, 0)),
              _spec((None, chunks, cfg.tq, chunk), lambda n, j: (n, 0, 0, 0)),
              _spec((None, r, dv), lambda n, j: (n, j, 0)),
              _spec((None, chunks, 1, chunk), lambda n, j: (n, 0, 0, 0))]
  args = [k, q, values, v]
  if cfg.masked:
    in_specs.append(_mask_spec(cfg, r, transposed=True))
    args.append(mask_t)
  in_specs += [_spec((None, 1, cfg.tq), lambda n, j: (n, 0, 0)),
               _spec((None, 1, cfg.tq), lambda n, j: (n, 0, 0)),
               _spec((None, cfg.tq, dv), lambda n, j: (n, 0, 0))]
  args += [lse_t, delta_t, d_out]
  key_blocks = cfg.tk // r
  out_shape = (jax.ShapeDtypeStruct(k.shape, jnp.float32),
               jax.ShapeDtypeStruct(values.shape, jnp.float32),
               jax.ShapeDtypeStruct((n, key_blocks, chunks, 1, chunk), jnp.float32))
  out_specs = (_spec((None, chunks, r, chunk), lambda n, j: (n, 0, j, 0)),
               _spec((None, r, dv), lambda n, j: (n, j, 0)),
               _spec((None, None, chunks, 1, chunk), lambda n, j: (n, j, 0, 0, 0)))
  cost = _costs(cfg, q, values, mask_t)["dkv"]
  kernel = functools.partial(_dkv_kernel, cfg=cfg, chunks=chunks)
  return _call(kernel, cfg, (n, key_blocks), in_specs, out_specs, out_shape, cost,
               _vmem(cfg, q, values), "additive_attention_dkv")(*args)


def _costs(cfg: _Config, q, values, mask):
  n, chunks, chunk, dv = _sizes(q, values)
  mask_bytes = 0 if mask is None else int(np.prod(mask.shape)) * mask.dtype.itemsize
  return cost_estimates(n, cfg.tq, cfg.tk, chunks * chunk, dv, q.dtype.itemsize, mask_bytes)


def _vmem(cfg: _Config, q, values) -> int:
  _, chunks, chunk, dv = _sizes(q, values)
  need = tpu_vmem_bytes(cfg.tq, cfg.tk, chunks * chunk, dv, cfg.blocks, cfg.masked,
                        q.dtype.itemsize)
  return min(TPU_VMEM_LIMIT_BYTES, max(32 * 2 ** 20, need + need // 4))


# ----------------------------------------------------------------------------
# The custom VJP on padded, chunk-major operands.


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _fused(q, k, values, v, mask, cfg: _Config):
  return _forward_call(cfg, q, k, values, v, mask)[0]


def _fused_forward(q, k, values, v, mask, cfg: _Config):
  out, lse = _forward_call(cfg, q, k, values, v, mask)
  return out, (q, k, values, v, mask, out, lse)


def _fused_backward(cfg: _Config, residuals, d_out):
  q, k, values, v, mask, out, lse = residuals
  d_out = d_out.astype(values.dtype)
  # delta_i = Σ_j p_ij dp_ij = d_out_i · out_i (FlashAttention-2).
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1,
                  keepdims=True)  # [N, Tq, 1]
  dq = _dq_call(cfg, q, k, values, v, mask, lse, delta, d_out)
  n, tq = lse.shape[:2]
  mask_t = None if mask is None else jnp.swapaxes(mask, -1, -2)
  dk, d_values, dv_parts = _dkv_call(cfg, q, k, values, v, mask_t, lse.reshape(n, 1, tq),
                                     delta.reshape(n, 1, tq), d_out)
  d_v = jnp.sum(dv_parts, axis=1)  # [N, C, 1, chunk]
  d_mask = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)
  return (dq.astype(q.dtype), dk.astype(k.dtype), d_values.astype(values.dtype),
          d_v.astype(v.dtype), d_mask)


_fused.defvjp(_fused_forward, _fused_backward)


# ----------------------------------------------------------------------------
# Public functions.


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _chunk_major(x, n: int, t: int, a: int, chunk: int):
  """`[N, T0, a0]` zero-padded to `[N, t, a]` -> `[N, a/chunk, t, chunk]`."""
  x = jnp.pad(x, ((0, 0), (0, t - x.shape[1]), (0, a - x.shape[2])))
  return x.reshape(n, t, a // chunk, chunk).transpose(0, 2, 1, 3)


def wins(lead: int, tq: int, tk: int, a: int, platform: str) -> bool:
  """Where `implementation="auto"` takes these kernels on a TPU or GPU: where
  the plain path would build the `[lead, Tq, Tk, a]` tanh block in chunks
  (`scores.additive`: more than `_ADDITIVE_BLOCK_ELEMENTS` elements, 16 MiB of
  float32), i.e. a `lax.map` of small programs that recompute the block in
  the backward and keep `[lead, Tq, Tk]` float32 scores and weights. The
  kernels hold neither; below that size one fused XLA program is kept. On a
  TPU they must also fit their VMEM (they keep one head's projected keys
  whole there; `tpu_vmem_bytes`). Never on a CPU, where they only run in
  interpret mode. A memory rule: on one H200 at B 32, a 1024 the kernels
  took 0.6-0.8x the chunked form's time (results/gpu_h200)."""
  from attention_jax import scores as scores_lib  # pylint: disable=g-import-not-at-top
  if platform not in ("gpu", "tpu"):
    return False
  if lead * tq * tk * a <= scores_lib._ADDITIVE_BLOCK_ELEMENTS:  # pylint: disable=protected-access
    return False
  if platform == "tpu":
    return tpu_vmem_bytes(tq, tk, a, 128, default_blocks("tpu")) <= TPU_VMEM_LIMIT_BYTES
  return True


def additive_attention_projected(q_proj: jax.Array, k_proj: jax.Array, values: jax.Array,
                                 v: jax.Array, mask: jax.Array | None = None, *,
                                 blocks: Blocks | None = None,
                                 interpret: bool | None = None) -> jax.Array:
  """`softmax(vᵀ tanh(q_proj + k_proj) | mask) values` by the Pallas kernels.

  Args:
    q_proj: `[..., Tq, a]` projected queries (`query W_q`, any bias added).
    k_proj: `[..., Tk, a]` projected keys.
    values: `[..., Tk, dv]`.
    v: `[..., a]`: one `v` (`[a]`) or one per leading index (e.g. per head,
      `[H, a]` for `[B, H, T, a]` inputs); broadcast over the leading axes.
    mask: optional bool broadcastable to `[..., Tq, Tk]`; True = may attend.
      A query with no valid key gets a zero context.
    blocks: tile sizes (default `default_blocks` of the platform).
    interpret: run in Pallas's interpret mode; default: on a CPU only.

  Returns:
    context `[..., Tq, dv]` in the values' dtype; differentiable in the
    projections, the values and `v`.
  """
  q_proj, k_proj, values, v = (_validate.as_float(x, n) for x, n in (
      (q_proj, "q_proj"), (k_proj, "k_proj"), (values, "values"), (v, "v")))
  for name, x in (("q_proj", q_proj), ("k_proj", k_proj), ("values", values)):
    _validate.rank_at_least(x, name, 2)
  _validate.rank_at_least(v, "v", 1)
  _validate.nonempty_axis(k_proj, "k_proj", -2, "key (Tk)")
  a = q_proj.shape[-1]
  if k_proj.shape[-1] != a or v.shape[-1] != a:
    raise ValueError(f"`q_proj`, `k_proj` and `v` must share a (their last axis): got "
                     f"{tuple(q_proj.shape)}, {tuple(k_proj.shape)}, {tuple(v.shape)}.")
  _validate.same_size(k_proj.shape[-2], values.shape[-2], "k_proj (Tk axis)",
                      "values (Tk axis)", k_proj.shape, values.shape)
  lead = _validate.broadcast_shapes({"q_proj (leading axes)": q_proj.shape[:-2],
                                     "k_proj (leading axes)": k_proj.shape[:-2],
                                     "values (leading axes)": values.shape[:-2],
                                     "v (leading axes)": v.shape[:-1]})
  tq0, tk0, dv0 = q_proj.shape[-2], k_proj.shape[-2], values.shape[-1]
  if mask is not None:
    mask = jnp.asarray(mask)
    _validate.boolean(mask, "mask")
    joint = _validate.broadcast_shapes({"mask": mask.shape, "scores": lead + (tq0, tk0)})
    if joint != lead + (tq0, tk0):
      raise ValueError(f"`mask` {tuple(mask.shape)} must broadcast to the scores shape "
                       f"{lead + (tq0, tk0)} without enlarging it.")
  platform = _platform()
  interpret = platform == "cpu" if interpret is None else bool(interpret)
  blocks = default_blocks(platform) if blocks is None else blocks
  if not isinstance(blocks, Blocks):
    raise TypeError(f"`blocks` must be a Blocks, got {type(blocks).__name__}.")
  step = math.lcm(blocks.rows, blocks.cols)
  tq, tk, a_pad = _round_up(tq0, step), _round_up(tk0, step), _round_up(a, blocks.chunk)
  if platform == "gpu" and not interpret:
    # Triton's tensors have power-of-two sizes, the chunk axis of a block too
    # (a = 200 in chunks of 32 failed to lower on an H200): padded features
    # have v = 0 and add nothing to the scores.
    chunks = a_pad // blocks.chunk
    a_pad = blocks.chunk * (1 << (chunks - 1).bit_length())
  # Triton's tensors have power-of-two sizes: the values' width is padded to one.
  dv = max(16, 1 << (dv0 - 1).bit_length()) if platform == "gpu" and not interpret else dv0
  if platform == "tpu" and not interpret:
    need = tpu_vmem_bytes(tq, tk, a_pad, dv, blocks, mask is not None,
                          jnp.dtype(jnp.float32).itemsize)
    if need > TPU_VMEM_LIMIT_BYTES:
      raise ValueError(
          f"the Pallas additive kernels keep one head's projections whole in VMEM: "
          f"Tq = {tq0}, Tk = {tk0}, a = {a} need {need / 2 ** 20:.0f} MiB, more than "
          f"{TPU_VMEM_LIMIT_BYTES / 2 ** 20:.0f} MiB; use implementation='plain'.")
  n = math.prod(lead)
  # The values keep bfloat16 / float32 (the kernels' matmuls take them);
  # anything else computes in float32.
  dtype = values.dtype if values.dtype in (jnp.bfloat16, jnp.float32) else jnp.float32

  def flat(x, t, f):
    return jnp.broadcast_to(x, lead + x.shape[-2:]).reshape(n, t, f)

  # The projections in float32 (the tanh and the score sums are float32 anyway).
  q = _chunk_major(flat(q_proj.astype(jnp.float32), tq0, a), n, tq, a_pad, blocks.chunk)
  k = _chunk_major(flat(k_proj.astype(jnp.float32), tk0, a), n, tk, a_pad, blocks.chunk)
  vv = jnp.broadcast_to(v.astype(jnp.float32), lead + (a,)).reshape(n, 1, a)
  vv = _chunk_major(vv, n, 1, a_pad, blocks.chunk)  # [N, C, 1, chunk]; padded features: v = 0
  vals = jnp.pad(flat(values.astype(dtype), tk0, dv0), ((0, 0), (0, tk - tk0), (0, dv - dv0)))
  m, per_query, per_head = None, False, False
  if mask is not None:
    m = blockwise._canonical_mask(mask, lead, tq0, tk0)  # [Nm, Tqm, Tk]  pylint: disable=protected-access
    per_query, per_head = m.shape[1] > 1, m.shape[0] > 1
    m = jnp.pad(m.astype(jnp.int32), ((0, 0), (0, tq - tq0 if per_query else 0),
                                      (0, tk - tk0)))
  cfg = _Config(blocks, tq, tk, tk0, platform, interpret, mask is not None, per_query, per_head)
  out = _fused(q, k, vals, vv, m, cfg)[:, :tq0, :dv0]  # [N, Tq, dv]
  return out.reshape(lead + (tq0, dv0)).astype(values.dtype)


def additive_attention(query: jax.Array, keys: jax.Array, values: jax.Array, w_q: jax.Array,
                       w_k: jax.Array, v: jax.Array, mask: jax.Array | None = None, *,
                       blocks: Blocks | None = None,
                       interpret: bool | None = None) -> jax.Array:
  """`attention(query, keys, values, score='additive', params={w_q, w_k, v},
  mask=mask)` by the Pallas kernels (`additive_attention_projected` of the
  projections, computed here by XLA with float32 accumulation).

  query `[..., Tq, dq]`, keys `[..., Tk, dk]`, values `[..., Tk, dv]`,
  w_q `[dq, a]`, w_k `[dk, a]`, v `[a]` -> context `[..., Tq, dv]`.
  """
  from attention_jax import scores  # pylint: disable=g-import-not-at-top
  args = [_validate.as_float(x, n) for x, n in zip(
      (query, keys, w_q, w_k, v), ("q", "k", "w_q", "w_k", "v"))]
  scores._check_additive(*args)  # pylint: disable=protected-access
  query, keys, w_q, w_k, v = args
  # The rest of the checks before the projections are computed.
  values = _validate.as_float(values, "values")
  _validate.rank_at_least(values, "values", 2)
  _validate.same_size(keys.shape[-2], values.shape[-2], "keys (Tk axis)", "values (Tk axis)",
                      keys.shape, values.shape)
  if mask is not None:
    _validate.boolean(jnp.asarray(mask), "mask")
  q_proj = jnp.matmul(query, w_q, preferred_element_type=jnp.float32)  # [..., Tq, a]
  k_proj = jnp.matmul(keys, w_k, preferred_element_type=jnp.float32)  # [..., Tk, a]
  return additive_attention_projected(q_proj, k_proj, values, v, mask, blocks=blocks,
                                      interpret=interpret)

