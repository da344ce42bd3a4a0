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

Kernels, each with a `(N, blocks)` grid of independent programs:
- forward, one query block per program, a loop over the key blocks;
- the backward, one key block per program, a loop over the query blocks,
  computing the transposed tiles (keys as rows, which the score's form
  `tanh(q'_i + k'_j)` allows without a transpose in the kernel): the
  gradients of the projected keys, the values and (as per-block partial
  sums) `v`, and in the `fused` form also the projected queries' gradient,
  which every key block adds into atomically;
- or, in the `split` form (`backward="split"`), that kernel without the
  queries' gradient (`dkv`) and a `dq` kernel in the forward's layout.

Tanh evaluations per (query, key, feature), the cost that bounds these
kernels on a GPU (`roofline`): the forward computes each once; the backward
twice in each kernel that needs the weights (once summed into the score
tile, from which the weights come, and once more for the tile's gradient,
since the score needs every chunk of `a` before the weights are known and a
whole `[rows, cols, a]` tanh tile does not fit a kernel's registers). So
`fused` takes 1 + 2 = 3, `split` 1 + 2 + 2 = 5 (`tanh_evaluations` counts
them in the traced kernels). `fused` pays with atomic float additions
(`N · Tk/rows · Tq · a` of them) whose order varies from run to run on a
GPU, so its queries' gradient is not bit-reproducible there. `fused` is the
default in interpret mode on a CPU, where it is tested; `split` on a TPU
(Mosaic has no atomic add, and the alternative, the queries' gradient of a
whole head resident in VMEM over a sequential grid axis, is neither written
nor compiled) and, until a GPU has compiled, checked and timed the fused
kernel, on a GPU (`backward="fused"` asks for it there).

`tanh_impl="approx"` takes tanh from the GPU's special-function unit
(`tanh.approx.f32`, one instruction) instead of libdevice's accurate `tanhf`;
in interpret mode a model of its error stands in (`approx_tanh_model`).

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
           "default_backward", "cost_estimates", "tpu_vmem_bytes", "TPU_VMEM_LIMIT_BYTES",
           "GpuRates", "H100_SXM", "H200_SXM", "roofline", "tanh_evaluations",
           "approx_tanh_model", "APPROX_TANH_MAX_REL_ERROR", "tile_candidates",
           "GPU_TILE_FLOATS_PER_THREAD", "GPU_SHARED_MEMORY_BYTES", "BACKWARDS", "TANH_IMPLS"]

BACKWARDS = ("fused", "split")
TANH_IMPLS = ("accurate", "approx")

# The most VMEM a kernel may ask Mosaic for on a TPU (v5e has 128 MiB per
# core; Mosaic's default scoped limit is 16 MiB, which the kernels exceed at
# a = 1024 from a few hundred keys on, since they keep one head's projected
# keys, or queries, whole in VMEM). What is left is for Mosaic's own scratch.
TPU_VMEM_LIMIT_BYTES = 100 * 2 ** 20

# What a Triton kernel's tanh tile may take per thread (float32 values,
# `rows · cols · chunk / (32 · num_warps)`): the default tile, 16 × 16 × 32
# over 4 warps, is 64, and with it ptxas gave the forward, `dq` and `dkv`
# kernels 128, 168 and 227 registers for `sm_90a` and no spills
# (results/compile_check/pallas_additive, commit d094991), against the 255 a
# thread may have (CUDA C++ Programming Guide, technical specifications per
# compute capability). Larger tiles per thread are not offered by
# `tile_candidates`: nothing has shown that they fit without spilling.
GPU_TILE_FLOATS_PER_THREAD = 64
# Shared memory one thread block may have on an H100 / H200 (compute
# capability 9.0: 227 KB; CUDA C++ Programming Guide, same table). Triton
# stages a dot's operands and cross-warp reductions there; `tile_candidates`
# charges a tile's tanh values, its score tile and the dot's operands to it.
GPU_SHARED_MEMORY_BYTES = 227 * 1024

# tanh.approx.f32 (one MUFU.TANH instruction since sm_75) has a maximum
# relative error of 1.113e-5 over all float32 inputs (N. Juffa's exhaustive
# measurement, NVIDIA developer forums, "Hardware-accelerated tanh() on
# Turing", 2021; the PTX ISA gives no figure). `approx_tanh_model`, which
# interpret mode uses in its place, measured 1.5281e-5 over a dense grid
# against float64 (tests/test_pallas_additive.py). The tests derive the
# approximate kernels' tolerances from this bound, above both.
APPROX_TANH_MAX_REL_ERROR = 1.6e-5


@dataclasses.dataclass(frozen=True)
class GpuRates:
  """Per-second peaks of one GPU for `roofline`: `fp32_flops` (FP32 FMA
  pipes, an FMA counted as 2; the kernels' float32 dots run there too: they
  ask for full precision, which Triton lowers to IEEE FMAs, not tensor
  cores), `sfu_ops` (special-function results: tanh, exp, reciprocal) and
  HBM `bandwidth` in bytes."""
  name: str
  fp32_flops: float
  sfu_ops: float
  bandwidth: float


# H100 SXM5 and H200 SXM: the same GH100 chip, 132 SMs, boost clock 1.98 GHz.
# FP32: 67 TFLOP/s (NVIDIA's H100 and H200 data sheets; 132 · 128 lanes · 2 ·
# 1.98 GHz). SFU: 16 results per clock per SM (CUDA C++ Programming Guide,
# throughput of native arithmetic instructions, compute capability 9.0: 32-bit
# reciprocal, reciprocal square root, base-2 exponential and logarithm, sine,
# cosine; tanh.approx is not in that table and is assumed to share the rate),
# 16 · 132 · 1.98e9 = 4.18e12 per second. FlashAttention-3 (Shah et al.
# 2024, section 3) gives 3.9 TFLOPS of special functions for the H100 SXM5,
# the same count at 1.83 GHz, the clock NVIDIA's 989 TFLOP/s dense bf16
# figure implies; the higher clock is taken so that the floor stays a lower
# bound. HBM: 3.35 TB/s (H100 SXM5), 4.8 TB/s (H200; data sheets).
_SFU_PER_CLOCK_PER_SM, _SMS, _BOOST_HZ = 16, 132, 1.98e9
H100_SXM = GpuRates("H100 SXM", fp32_flops=67e12,
                    sfu_ops=_SFU_PER_CLOCK_PER_SM * _SMS * _BOOST_HZ, bandwidth=3.35e12)
H200_SXM = GpuRates("H200 SXM", fp32_flops=67e12,
                    sfu_ops=_SFU_PER_CLOCK_PER_SM * _SMS * _BOOST_HZ, bandwidth=4.8e12)


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes: `rows` (on sublanes: queries in the forward and `dq`
  kernels, keys in the backward's), `cols` (on lanes: the other side),
  `chunk` (the features of `a` in one tanh tile). The tanh tile is
  `rows × cols × chunk`. `num_warps`: Triton's warps per program (GPU only)."""
  rows: int
  cols: int
  chunk: int
  num_warps: int = 4

  def __post_init__(self):
    for name in ("rows", "cols", "chunk", "num_warps"):
      _validate.positive_int(getattr(self, name), name)


def default_blocks(platform: str) -> Blocks:
  """Tile sizes per platform. TPU: a lane-dense `[8, 128]` score tile and
  128-wide chunks (Mosaic slices lanes at multiples of 128; a 512 KiB tanh
  tile). GPU (Triton): powers of two of at least 16 (its `dot` needs them),
  `16 × 16 × 32`, 8k float32 values, 64 per thread of 4 warps. Interpret
  mode (CPU): small tiles. None of them is tuned: no device has timed them
  (`tile_candidates` lists the tiles the benchmark's tile search times)."""
  if platform == "tpu":
    return Blocks(8, 128, 128)
  if platform == "gpu":
    return Blocks(16, 16, 32)
  return Blocks(8, 8, 8)


def default_backward(platform: str) -> str:
  """`fused` (3 tanh evaluations per element over forward and backward) on a
  CPU, i.e. in interpret mode, where it is tested; `split` (5) on a TPU,
  whose Mosaic kernels have no atomic add, and on a GPU until the fused
  kernel has been compiled and timed there (its atomic adds and registers
  are unmeasured; the module docstring)."""
  return "fused" if platform == "cpu" else "split"


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
  backward: str = "fused"  # BACKWARDS
  tanh_impl: str = "accurate"  # TANH_IMPLS


def _dot(a, b, contract_b: int):
  """`a [m, k] @ b` (b `[k, n]` with `contract_b` 0, `[n, k]` with 1),
  accumulated in float32; float32 operands at full precision (a TPU's and
  Triton's defaults round float32 operands to bfloat16 / tf32)."""
  precision = (jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 and b.dtype == jnp.float32
               else None)
  return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------
# tanh.


def approx_tanh_model(x):
  """What interpret mode computes for `tanh_impl="approx"`: float32 tanh with
  the 7 lowest of its 23 fraction bits cleared, i.e. rounded towards zero to
  16 bits, a relative error below 2^-16 (plus the float32 tanh's own, at most
  2.7e-7 on XLA's CPU; 1.5281e-5 together, measured) and never larger in
  magnitude than tanh, so |result| ≤ 1.

  Why a model and not a formula: interpret mode exists for the tests, and a
  test of the approximate kernels is worth having only if it sees at least
  the error the GPU's tanh.approx.f32 makes (1.113e-5 at most,
  `APPROX_TANH_MAX_REL_ERROR`). An accurate CPU formula would hide it; this
  one is a little worse than the instruction and errs in one direction, the
  harder case for the sums over `a`."""
  t = jnp.tanh(x.astype(jnp.float32))
  bits = jax.lax.bitcast_convert_type(t, jnp.uint32)
  return jax.lax.bitcast_convert_type(bits & jnp.uint32(0xFFFFFF80), jnp.float32)


def _tanh(x, cfg: _Config):
  """tanh of a float32 tile as the configured kernels take it."""
  if cfg.tanh_impl == "accurate":
    return jnp.tanh(x)  # Triton: libdevice's __nv_tanhf
  if cfg.interpret:
    return approx_tanh_model(x)
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top
  return pltriton.approx_tanh(x)  # one tanh.approx.f32 per element


# ----------------------------------------------------------------------------
# Kernel bodies (refs: Pallas blocks; shapes given without the squeezed N axis).


def _tile_scores(cfg: _Config, rows_ref, cols_ref, v_ref, start, cols: int, chunks: int):
  """`s[r, c] = Σ_f v_f tanh(rows[r, f] + cols[start + c, f])`, float32
  `[R, cols]`, one chunk of features at a time.

  rows_ref `[C, R, chunk]`, cols_ref `[C, T, chunk]`, v_ref `[C, 1, chunk]`.
  """
  def chunk(f, acc):
    x = rows_ref[f].astype(jnp.float32)  # [R, chunk]
    y = cols_ref[f, pl.ds(start, cols), :].astype(jnp.float32)  # [cols, chunk]
    w = v_ref[f].astype(jnp.float32)  # [1, chunk]
    hidden = _tanh(x[:, None, :] + y[None, :, :], cfg)  # [R, cols, chunk]
    return acc + jnp.sum(hidden * w[None], axis=-1)  # [R, cols]

  init = jnp.zeros((rows_ref.shape[1], cols), jnp.float32)
  return jax.lax.fori_loop(0, chunks, chunk, init)


def _tile_gradients(cfg: _Config, rows_ref, cols_ref, v_ref, start, cols: int, chunks: int,
                    d_scores, d_rows_ref, d_v_ref=None, d_cols_ref=None):
  """Adds the tile's share of the gradients, with `g = ds · (1 - tanh²)`:
  `d_rows[f] += v_f Σ_c g[:, c, f]`; if `d_v_ref` is given,
  `d_v[f] += Σ_{r, c} ds · tanh`; if `d_cols_ref` is given (the whole head's
  `[C, T, chunk]`, which other programs add into at the same time),
  `d_cols[f, start + c] += v_f Σ_r g[r, c, f]` atomically. One tanh per
  element: both sides' gradients come from the same `g`. `d_scores` float32
  `[R, cols]`."""
  def chunk(f, carry):
    x = rows_ref[f].astype(jnp.float32)  # [R, chunk]
    y = cols_ref[f, pl.ds(start, cols), :].astype(jnp.float32)  # [cols, chunk]
    w = v_ref[f].astype(jnp.float32)  # [1, chunk]
    hidden = _tanh(x[:, None, :] + y[None, :, :], cfg)  # [R, cols, chunk]
    ds = d_scores[:, :, None]  # [R, cols, 1]
    g = ds * (1.0 - hidden * hidden)  # [R, cols, chunk]
    d_rows_ref[f] += w * jnp.sum(g, axis=1)  # [R, chunk]
    if d_cols_ref is not None:
      from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top
      pltriton.atomic_add(d_cols_ref, (f, pl.ds(start, cols), slice(None)),
                          w * jnp.sum(g, axis=0))  # [cols, chunk]
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
    s = _tile_scores(cfg, q_ref, k_ref, v_ref, start, cols, chunks)  # [R, cols]
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
    s = _tile_scores(cfg, q_ref, k_ref, v_ref, start, cols, chunks)  # [R, cols]
    ok = _valid(cfg, mask_ref, 0, start, rows, cols, keys_on_rows=False)
    p = jnp.where(ok, jnp.exp(s - lse), 0.0)  # the weights; 0 where lse = +inf
    d_p = _dot(d_out, values_ref[pl.ds(start, cols), :], 1)  # [R, cols]
    _tile_gradients(cfg, q_ref, k_ref, v_ref, start, cols, chunks, p * (d_p - delta), dq_ref)
    return carry

  jax.lax.fori_loop(0, cfg.tk // cols, key_block, 0)


def _dkv_kernel(k_ref, q_ref, values_ref, v_ref, *refs, cfg: _Config, chunks: int):
  # Transposed: this program's keys are the rows. k_ref [C, R, chunk],
  # q_ref [C, Tq, chunk], values_ref [R, dv], v_ref [C, 1, chunk],
  # mask_ref [R, Tq or 1] (the transposed mask), lse_ref / delta_ref [1, Tq],
  # d_out_ref [Tq, dv]; out: dk_ref [C, R, chunk], d_values_ref [R, dv],
  # dv_ref [C, 1, chunk] (this key block's share of v's gradient), float32.
  # Fused (`cfg.backward`): also an input of zeros aliased to dq_ref, the
  # whole head's [C, Tq, chunk] queries' gradient, which every key block's
  # program adds into (the input's ref itself is not read).
  refs = refs if cfg.masked else (None,) + refs
  if cfg.backward == "fused":
    mask_ref, lse_ref, delta_ref, d_out_ref, _, dk_ref, d_values_ref, dv_ref, dq_ref = refs
  else:
    mask_ref, lse_ref, delta_ref, d_out_ref, dk_ref, d_values_ref, dv_ref = refs
    dq_ref = None
  rows, cols = cfg.blocks.rows, cfg.blocks.cols
  for ref in (dk_ref, d_values_ref, dv_ref):
    ref[...] = jnp.zeros(ref.shape, ref.dtype)
  row_start = pl.program_id(1) * rows
  values = values_ref[...]  # [R, dv]

  def query_block(i, carry):
    start = pl.multiple_of(i * cols, cols)
    s_t = _tile_scores(cfg, k_ref, q_ref, v_ref, start, cols, chunks)  # [R keys, cols queries]
    ok = _valid(cfg, None, row_start, start, rows, cols, keys_on_rows=True)
    if mask_ref is not None:
      m = mask_ref[:, pl.ds(start, cols)] if cfg.mask_per_query else mask_ref[...]
      ok = jnp.logical_and(ok, m != 0)
    p_t = jnp.where(ok, jnp.exp(s_t - lse_ref[:, pl.ds(start, cols)]), 0.0)  # [R, cols]
    d_out = d_out_ref[pl.ds(start, cols), :]  # [cols, dv]
    d_values_ref[...] += _dot(p_t.astype(d_out.dtype), d_out, 0)  # [R, dv]
    d_p_t = _dot(values, d_out, 1)  # [R, cols]
    d_s_t = p_t * (d_p_t - delta_ref[:, pl.ds(start, cols)])
    _tile_gradients(cfg, k_ref, q_ref, v_ref, start, cols, chunks, d_s_t, dk_ref, dv_ref,
                    d_cols_ref=dq_ref)
    return carry

  jax.lax.fori_loop(0, cfg.tq // cols, query_block, 0)


# ----------------------------------------------------------------------------
# Costs and TPU memory (pure).


def cost_estimates(n: int, tq: int, tk: int, a: int, dv: int, itemsize: int = 4,
                   mask_bytes: int = 0, backward: str = "split") -> dict[str, dict[str, int]]:
  """`{kernel: {flops, transcendentals, bytes_accessed}}` of the kernels at
  these (padded) sizes, for `pl.CostEstimate`: `forward`, then `dq` and `dkv`
  (`backward="split"`) or `backward` (`"fused"`).

  Per (query, key, feature): the forward adds, takes tanh, multiplies by v
  and sums (3 FLOPs, 1 tanh); each backward kernel recomputes that and then
  forms `ds · (1 - h²)` and sums it (4 more), `dkv` also `ds · h` summed
  (2 more); the fused one recomputes the score (3), adds again before its
  second tanh, forms `ds · (1 - h²)` (4) and sums it both ways (2), and
  `ds · h` summed (2): 11. Per (query, key): the softmax (~5) and one exp,
  and `2·dv` per matmul with the values (one in the forward and `dq`, two in
  `dkv` and the fused kernel). Bytes: every operand and result once (the
  kernels keep one head's keys or queries in fast memory while they loop over
  them; the fused kernel's atomic additions are counted as one write of the
  queries' gradient, though they go to L2 once per key block).
  """
  if backward not in BACKWARDS:
    raise ValueError(f"`backward` must be one of {BACKWARDS}, got {backward!r}.")
  pairs = n * tq * tk
  proj = n * (tq + tk) * a * itemsize
  vals = n * tk * dv * itemsize
  rows_out = n * tq * dv * itemsize
  stats = n * tq * 4
  costs = {"forward": dict(flops=pairs * (3 * a + 2 * dv + 5), transcendentals=pairs * (a + 1),
                           bytes_accessed=proj + vals + rows_out + stats + mask_bytes)}
  dkv_bytes = (proj + vals + rows_out + 2 * stats + n * tk * (a + dv) * 4 + mask_bytes)
  if backward == "fused":
    costs["backward"] = dict(flops=pairs * (11 * a + 4 * dv + 5),
                             transcendentals=pairs * (2 * a + 1),
                             bytes_accessed=dkv_bytes + n * tq * a * 4)
    return costs
  costs["dq"] = dict(flops=pairs * (7 * a + 2 * dv + 5), transcendentals=pairs * (2 * a + 1),
                     bytes_accessed=proj + vals + rows_out + 2 * stats + n * tq * a * 4
                     + mask_bytes)
  costs["dkv"] = dict(flops=pairs * (9 * a + 4 * dv + 5), transcendentals=pairs * (2 * a + 1),
                      bytes_accessed=dkv_bytes)
  return costs


def roofline(n: int, tq: int, tk: int, a: int, dv: int, *, backward: str = "fused",
             passes: str = "fwd_bwd", rates: GpuRates = H200_SXM, itemsize: int = 4,
             sfu_per_tanh: int = 1, rows: int | None = None) -> dict:
  """The kernels' time floor on a GPU at these (padded) sizes, counting the
  special-function work apart from the FLOPs and bytes:
  `max(flops / rates.fp32_flops, sfu_ops / rates.sfu_ops, bytes / rates.bandwidth)`.

  `passes`: "fwd" (the forward kernel) or "fwd_bwd" (forward and backward).
  `backward`: "fused" (3 tanh evaluations per (query, key, feature) over
  forward and backward) or "split" (5). `sfu_per_tanh`: special-function
  results one tanh takes; 1 for tanh.approx.f32 (MUFU.TANH); libdevice's
  accurate tanhf may take more (an exp2 and a reciprocal: 2) besides FMAs on
  the FP32 pipe, which is not verified here, so 1 keeps the floor a lower
  bound. Exps (one per (query, key) and kernel) are special functions too.
  FLOPs and bytes are `cost_estimates`'. Atomic additions (fused: one per
  query, feature and block of `rows` keys, default the GPU's) are counted
  (`atomic_adds`) but not timed: no published rate for them is used.

  Returns `{tanh, sfu_ops, flops, bytes, flops_s, sfu_s, bytes_s, floor_s,
  bound, atomic_adds}` (`bound`: which term is the floor).
  """
  if passes not in ("fwd", "fwd_bwd"):
    raise ValueError(f"`passes` must be 'fwd' or 'fwd_bwd', got {passes!r}.")
  costs = cost_estimates(n, tq, tk, a, dv, itemsize, backward=backward)
  kernels = ["forward"] if passes == "fwd" else list(costs)
  pairs = n * tq * tk
  tanh_per_element = {"forward": 1, "backward": 2, "dq": 2, "dkv": 2}
  tanh = sum(tanh_per_element[k] for k in kernels) * pairs * a
  exps = sum(costs[k]["transcendentals"] for k in kernels) - tanh
  flops = sum(costs[k]["flops"] for k in kernels)
  nbytes = sum(costs[k]["bytes_accessed"] for k in kernels)
  sfu_ops = sfu_per_tanh * tanh + exps
  terms = {"flops": flops / rates.fp32_flops, "sfu": sfu_ops / rates.sfu_ops,
           "bytes": nbytes / rates.bandwidth}
  bound = max(terms, key=terms.get)
  rows = default_blocks("gpu").rows if rows is None else rows
  atomic_adds = (n * -(-tk // rows) * tq * a
                 if backward == "fused" and passes == "fwd_bwd" else 0)
  return dict(tanh=tanh, sfu_ops=sfu_ops, flops=flops, bytes=nbytes, flops_s=terms["flops"],
              sfu_s=terms["sfu"], bytes_s=terms["bytes"], floor_s=terms[bound], bound=bound,
              atomic_adds=atomic_adds)


def tanh_evaluations(jaxpr) -> dict[str, int]:
  """`{kernel name: tanh values computed}` over the Pallas calls of a traced
  program (`jax.make_jaxpr(f)(...)`, e.g. of a `jax.grad`), each call's
  count summed over its whole grid.

  How it counts: in each `pallas_call`'s kernel jaxpr, every `tanh`
  primitive, or inline assembly running `tanh.approx` (the approximate GPU
  form), adds the elements of its result, times the trip counts of the
  `scan`s (the kernels' `fori_loop`s with static bounds) around it; a `cond`
  adds its costliest branch; the kernel's total is multiplied by the number
  of programs in its grid. This is what runs, tanh by tanh, since each
  program evaluates its whole body. A tanh inside a `while` loop (unknown
  trip count) raises. Dividing by `N·Tq·Tk·a` (padded) gives evaluations per
  (query, key, feature).
  """
  def is_tanh(eqn) -> bool:
    name = eqn.primitive.name
    # The inline-assembly primitive is "elementwise_inline_asm_p" in jax 0.10.
    return name == "tanh" or (name.startswith("elementwise_inline_asm")
                              and "tanh" in str(eqn.params.get("asm", "")))

  def body(inner) -> int:
    total = 0
    for eqn in inner.eqns:
      name = eqn.primitive.name
      if is_tanh(eqn):
        total += math.prod(eqn.outvars[0].aval.shape)
      elif name == "scan":
        total += eqn.params["length"] * body(eqn.params["jaxpr"].jaxpr)
      elif name == "cond":
        total += max(body(b.jaxpr) for b in eqn.params["branches"])
      elif name == "while":
        if any(body(sub) for sub in _sub_jaxprs(eqn.params)):
          raise ValueError("a tanh inside a while loop: its trip count is unknown.")
      else:
        total += sum(body(sub) for sub in _sub_jaxprs(eqn.params))
    return total

  counts: dict[str, int] = {}

  def walk(inner):
    for eqn in inner.eqns:
      if eqn.primitive.name == "pallas_call":
        name = str(eqn.params.get("name") or "pallas_call")
        programs = math.prod(eqn.params["grid_mapping"].grid)
        counts[name] = counts.get(name, 0) + programs * body(eqn.params["jaxpr"])
        continue
      for sub in _sub_jaxprs(eqn.params):
        walk(sub)

  walk(getattr(jaxpr, "jaxpr", jaxpr))
  return counts


def _sub_jaxprs(params):
  """The jaxprs held in an equation's parameters (a ClosedJaxpr's inner one)."""
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      inner = getattr(item, "jaxpr", item)
      if hasattr(inner, "eqns"):
        yield inner


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


def _powers_of_two(low: int, high: int) -> list[int]:
  return [1 << e for e in range(low.bit_length() - 1, high.bit_length()) if low <= 1 << e <= high]


def tile_candidates(platform: str, tq: int, tk: int, a: int, dv: int = 64,
                    masked: bool = False) -> list[Blocks]:
  """The tiles the benchmark's tile search times
  (`experiments/kernels/additive.py`), smallest tanh tile first.

  GPU (Triton): `rows`, `cols` and `chunk` powers of two from 16 (Triton's
  dot needs 16 on the score tile's sides; 16 float32 features keep each
  row's loads 64 bytes wide), none beyond what it tiles (the longer of Tq
  and Tk, or a, rounded up to a power of two), 4 or 8 warps; kept when the
  tanh tile takes at most `GPU_TILE_FLOATS_PER_THREAD` values per thread and
  the tanh tile, the score tile and the dots' operands fit
  `GPU_SHARED_MEMORY_BYTES` (the register budget binds first: 64 per thread
  of 8 warps is 64 KiB). TPU: `rows` 8–64 (sublanes), `cols` and `chunk`
  128–512 (lanes), within `TPU_VMEM_LIMIT_BYTES` by `tpu_vmem_bytes`.
  """
  for name, value in (("tq", tq), ("tk", tk), ("a", a), ("dv", dv)):
    _validate.positive_int(value, name)
  t = max(tq, tk)
  found = []
  if platform == "gpu":
    dv_pad = max(16, 1 << (dv - 1).bit_length())
    side = _powers_of_two(16, max(16, 1 << (t - 1).bit_length()))
    chunks = _powers_of_two(16, max(16, 1 << (a - 1).bit_length()))
    for rows in side:
      for cols in side:
        for chunk in chunks:
          for warps in (4, 8):
            tile = rows * cols * chunk
            shared = 4 * (tile + rows * cols + (rows + cols) * dv_pad)
            if (tile <= GPU_TILE_FLOATS_PER_THREAD * 32 * warps
                and shared <= GPU_SHARED_MEMORY_BYTES):
              found.append(Blocks(rows, cols, chunk, warps))
  elif platform == "tpu":
    for rows in (8, 16, 32, 64):
      for cols in (128, 256, 512):
        for chunk in (128, 256, 512):
          if rows > _round_up(t, 8) or cols > _round_up(t, 128) or chunk > _round_up(a, 128):
            continue
          blocks = Blocks(rows, cols, chunk)
          step = math.lcm(rows, cols)
          need = tpu_vmem_bytes(_round_up(tq, step), _round_up(tk, step), _round_up(a, chunk),
                                dv, blocks, masked)
          if need <= TPU_VMEM_LIMIT_BYTES:
            found.append(blocks)
  else:
    raise ValueError(f"`platform` must be 'gpu' or 'tpu', got {platform!r}.")
  return sorted(found, key=lambda b: (b.rows * b.cols * b.chunk, b.rows, b.cols, b.chunk,
                                      b.num_warps))


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
  return pltriton.CompilerParams(num_warps=cfg.blocks.num_warps, num_stages=2)


def _spec(block, index):
  """A BlockSpec with the leading N axis squeezed (`None` in `block`)."""
  return pl.BlockSpec(block, index)


def _call(kernel, cfg: _Config, grid, in_specs, out_specs, out_shape, cost: dict,
          vmem_bytes: int, name: str, aliases: dict[int, int] | None = None):
  return pl.pallas_call(
      kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      interpret=cfg.interpret, compiler_params=_compiler_params(cfg, vmem_bytes),
      cost_estimate=pl.CostEstimate(**cost), name=name, input_output_aliases=aliases or {})


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
  """The backward kernel over key blocks: `(dk, d_values, dv_parts)`, and
  `dq` last when `cfg.backward` is fused."""
  n, chunks, chunk, dv = _sizes(q, values)
  r = cfg.blocks.rows
  fused = cfg.backward == "fused"
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
  out_shape = [jax.ShapeDtypeStruct(k.shape, jnp.float32),
               jax.ShapeDtypeStruct(values.shape, jnp.float32),
               jax.ShapeDtypeStruct((n, key_blocks, chunks, 1, chunk), jnp.float32)]
  out_specs = [_spec((None, chunks, r, chunk), lambda n, j: (n, 0, j, 0)),
               _spec((None, r, dv), lambda n, j: (n, j, 0)),
               _spec((None, None, chunks, 1, chunk), lambda n, j: (n, j, 0, 0, 0))]
  aliases = None
  if fused:
    # The queries' gradient: the key blocks of one head add into the same
    # whole-head block, so it starts as zeros (Pallas leaves outputs
    # uninitialised; no program may zero it, as they run concurrently).
    whole_head = _spec((None, chunks, cfg.tq, chunk), lambda n, j: (n, 0, 0, 0))
    in_specs.append(whole_head)
    args.append(jnp.zeros(q.shape, jnp.float32))
    out_shape.append(jax.ShapeDtypeStruct(q.shape, jnp.float32))
    out_specs.append(whole_head)
    aliases = {len(args) - 1: len(out_shape) - 1}
  costs = _costs(cfg, q, values, mask_t)
  kernel = functools.partial(_dkv_kernel, cfg=cfg, chunks=chunks)
  return _call(kernel, cfg, (n, key_blocks), in_specs, tuple(out_specs), tuple(out_shape),
               costs["backward" if fused else "dkv"], _vmem(cfg, q, values),
               "additive_attention_bwd" if fused else "additive_attention_dkv",
               aliases)(*args)


def _costs(cfg: _Config, q, values, mask):
  n, chunks, chunk, dv = _sizes(q, values)
  mask_bytes = 0 if mask is None else int(np.prod(mask.shape)) * mask.dtype.itemsize
  return cost_estimates(n, cfg.tq, cfg.tk, chunks * chunk, dv, q.dtype.itemsize, mask_bytes,
                        cfg.backward)


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
  n, tq = lse.shape[:2]
  mask_t = None if mask is None else jnp.swapaxes(mask, -1, -2)
  grads = _dkv_call(cfg, q, k, values, v, mask_t, lse.reshape(n, 1, tq),
                    delta.reshape(n, 1, tq), d_out)
  if cfg.backward == "fused":
    dk, d_values, dv_parts, dq = grads
  else:
    dk, d_values, dv_parts = grads
    dq = _dq_call(cfg, q, k, values, v, mask, lse, delta, d_out)
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
                                 interpret: bool | None = None, backward: str | None = None,
                                 tanh_impl: str = "accurate") -> jax.Array:
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
    backward: "fused" (3 tanh evaluations per (query, key, feature) over
      forward and backward; atomic adds) or "split" (5; none); default
      `default_backward` of the platform; a TPU has only "split".
    tanh_impl: "accurate" (jnp.tanh) or "approx": on a GPU the hardware's
      tanh.approx.f32 (relative error ≤ 1.113e-5, one special-function
      instruction), in interpret mode `approx_tanh_model`; not on a TPU.

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
  backward = default_backward(platform) if backward is None else backward
  if backward not in BACKWARDS:
    raise ValueError(f"`backward` must be one of {BACKWARDS}, got {backward!r}.")
  if tanh_impl not in TANH_IMPLS:
    raise ValueError(f"`tanh_impl` must be one of {TANH_IMPLS}, got {tanh_impl!r}.")
  if platform == "tpu" and not interpret and (backward, tanh_impl) != ("split", "accurate"):
    raise ValueError("on a TPU the Pallas additive kernels have backward='split' and "
                     "tanh_impl='accurate' only (Mosaic has no atomic add and no "
                     f"approximate tanh here); got backward={backward!r}, "
                     f"tanh_impl={tanh_impl!r}.")
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
  cfg = _Config(blocks, tq, tk, tk0, platform, interpret, mask is not None, per_query, per_head,
                backward, tanh_impl)
  out = _fused(q, k, vals, vv, m, cfg)[:, :tq0, :dv0]  # [N, Tq, dv]
  return out.reshape(lead + (tq0, dv0)).astype(values.dtype)


def additive_attention(query: jax.Array, keys: jax.Array, values: jax.Array, w_q: jax.Array,
                       w_k: jax.Array, v: jax.Array, mask: jax.Array | None = None, *,
                       blocks: Blocks | None = None, interpret: bool | None = None,
                       backward: str | None = None, tanh_impl: str = "accurate") -> jax.Array:
  """`attention(query, keys, values, score='additive', params={w_q, w_k, v},
  mask=mask)` by the Pallas kernels (`additive_attention_projected` of the
  projections, computed here by XLA with float32 accumulation).

  query `[..., Tq, dq]`, keys `[..., Tk, dk]`, values `[..., Tk, dv]`,
  w_q `[dq, a]`, w_k `[dk, a]`, v `[a]` -> context `[..., Tq, dv]`;
  `blocks`, `interpret`, `backward`, `tanh_impl` as there.
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
                                      interpret=interpret, backward=backward,
                                      tanh_impl=tanh_impl)

