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

Modules: `tiling` (tile sizes, platform defaults, memory budgets, the tile
search's candidates), `costs` (FLOPs, special functions and bytes per kernel,
the GPU roofline, tanh counts of a traced program), `kernels` (the kernel
bodies, their calls and the custom VJP); this one checks and lays out the
operands and picks where the kernels pay (`wins`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_jax import _validate
from attention_jax import blockwise
from attention_jax.pallas_additive.costs import (H100_SXM, H200_SXM, GpuRates, cost_estimates,
                                                 roofline, tanh_evaluations)
from attention_jax.pallas_additive.kernels import (APPROX_TANH_MAX_REL_ERROR, Config,
                                                   approx_tanh_model, fused_attention)
from attention_jax.pallas_additive.tiling import (BACKWARDS, GPU_SHARED_MEMORY_BYTES,
                                                  GPU_TILE_FLOATS_PER_THREAD, TANH_IMPLS,
                                                  TPU_VMEM_LIMIT_BYTES, Blocks, default_backward,
                                                  default_blocks, round_up, tile_candidates,
                                                  tpu_vmem_bytes)

__all__ = ["additive_attention", "additive_attention_projected", "Blocks", "default_blocks",
           "default_backward", "cost_estimates", "tpu_vmem_bytes", "TPU_VMEM_LIMIT_BYTES",
           "GpuRates", "H100_SXM", "H200_SXM", "roofline", "tanh_evaluations",
           "approx_tanh_model", "APPROX_TANH_MAX_REL_ERROR", "tile_candidates",
           "GPU_TILE_FLOATS_PER_THREAD", "GPU_SHARED_MEMORY_BYTES", "BACKWARDS", "TANH_IMPLS"]


def _platform() -> str:
  """'tpu', 'gpu' or 'cpu': what `jax.default_backend()` says (the compile
  check makes it answer the target's platform while it traces)."""
  backend = jax.default_backend()
  return backend if backend in ("tpu", "gpu") else "cpu"


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
  mask = _validate.mask_within(mask, lead + (tq0, tk0))
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
  tq, tk, a_pad = round_up(tq0, step), round_up(tk0, step), round_up(a, blocks.chunk)
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
  cfg = Config(blocks, tq, tk, tk0, platform, interpret, mask is not None, per_query, per_head,
                backward, tanh_impl)
  out = fused_attention(q, k, vals, vv, m, cfg)[:, :tq0, :dv0]  # [N, Tq, dv]
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
