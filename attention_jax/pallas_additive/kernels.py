"""The Pallas additive kernels themselves: the forward, `dq` and `dkv` (or
fused backward) kernel bodies, their `pallas_call`s, and the custom VJP that
joins them (`fused_attention`), on padded, chunk-major operands
(`[N, C, T, chunk]`; the package's docstring gives the scheme).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
import numpy as np

from attention_jax.pallas_additive.costs import cost_estimates
from attention_jax.pallas_additive.tiling import TPU_VMEM_LIMIT_BYTES, Blocks, tpu_vmem_bytes

# tanh.approx.f32 (one MUFU.TANH instruction since sm_75) has a maximum
# relative error of 1.113e-5 over all float32 inputs (N. Juffa's exhaustive
# measurement, NVIDIA developer forums, "Hardware-accelerated tanh() on
# Turing", 2021; the PTX ISA gives no figure). `approx_tanh_model`, which
# interpret mode uses in its place, measured 1.5281e-5 over a dense grid
# against float64 (tests/test_pallas_additive.py). The tests derive the
# approximate kernels' tolerances from this bound, above both.
APPROX_TANH_MAX_REL_ERROR = 1.6e-5


@dataclasses.dataclass(frozen=True)
class Config:
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


def _tanh(x, cfg: Config):
  """tanh of a float32 tile as the configured kernels take it."""
  if cfg.tanh_impl == "accurate":
    return jnp.tanh(x)  # Triton: libdevice's __nv_tanhf
  if cfg.interpret:
    return approx_tanh_model(x)
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top
  return pltriton.approx_tanh(x)  # one tanh.approx.f32 per element


# ----------------------------------------------------------------------------
# Kernel bodies (refs: Pallas blocks; shapes given without the squeezed N axis).


def _tile_scores(cfg: Config, rows_ref, cols_ref, v_ref, start, cols: int, chunks: int):
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


def _tile_gradients(cfg: Config, rows_ref, cols_ref, v_ref, start, cols: int, chunks: int,
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


def _valid(cfg: Config, mask_ref, row_start, col_start, rows: int, cols: int,
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


def _forward_kernel(q_ref, k_ref, values_ref, v_ref, *refs, cfg: Config, chunks: int):
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


def _dq_kernel(q_ref, k_ref, values_ref, v_ref, *refs, cfg: Config, chunks: int):
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


def _dkv_kernel(k_ref, q_ref, values_ref, v_ref, *refs, cfg: Config, chunks: int):
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
# pallas_call wrappers.


def _compiler_params(cfg: Config, vmem_bytes: int):
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


def _call(kernel, cfg: Config, grid, in_specs, out_specs, out_shape, cost: dict,
          vmem_bytes: int, name: str, aliases: dict[int, int] | None = None):
  return pl.pallas_call(
      kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      interpret=cfg.interpret, compiler_params=_compiler_params(cfg, vmem_bytes),
      cost_estimate=pl.CostEstimate(**cost), name=name, input_output_aliases=aliases or {})


def _mask_spec(cfg: Config, rows: int, transposed: bool):
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


def _query_block_inputs(cfg: Config, q, k, values, v, mask) -> tuple[list, list]:
  """(in_specs, args) shared by the kernels with a program per query block
  (the forward and `dq`): this block's queries, the head's keys, values and
  `v` whole, and the mask's rows of the block."""
  _, chunks, chunk, dv = _sizes(q, values)
  r = cfg.blocks.rows
  in_specs = [_spec((None, chunks, r, chunk), lambda n, i: (n, 0, i, 0)),
              _spec((None, chunks, cfg.tk, chunk), lambda n, i: (n, 0, 0, 0)),
              _spec((None, cfg.tk, dv), lambda n, i: (n, 0, 0)),
              _spec((None, chunks, 1, chunk), lambda n, i: (n, 0, 0, 0))]
  args = [q, k, values, v]
  if cfg.masked:
    in_specs.append(_mask_spec(cfg, r, transposed=False))
    args.append(mask)
  return in_specs, args


def _forward_call(cfg: Config, q, k, values, v, mask):
  n, chunks, _, dv = _sizes(q, values)
  r = cfg.blocks.rows
  in_specs, args = _query_block_inputs(cfg, q, k, values, v, mask)
  out_shape = (jax.ShapeDtypeStruct((n, cfg.tq, dv), values.dtype),
               jax.ShapeDtypeStruct((n, cfg.tq, 1), jnp.float32))
  out_specs = (_spec((None, r, dv), lambda n, i: (n, i, 0)),
               _spec((None, r, 1), lambda n, i: (n, i, 0)))
  cost = _costs(cfg, q, values, mask)["forward"]
  kernel = functools.partial(_forward_kernel, cfg=cfg, chunks=chunks)
  return _call(kernel, cfg, (n, cfg.tq // r), in_specs, out_specs, out_shape, cost,
               _vmem(cfg, q, values), "additive_attention_fwd")(*args)


def _dq_call(cfg: Config, q, k, values, v, mask, lse, delta, d_out):
  n, chunks, chunk, dv = _sizes(q, values)
  r = cfg.blocks.rows
  in_specs, args = _query_block_inputs(cfg, q, k, values, v, mask)
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


def _dkv_call(cfg: Config, q, k, values, v, mask_t, lse_t, delta_t, d_out):
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


def _costs(cfg: Config, q, values, mask):
  n, chunks, chunk, dv = _sizes(q, values)
  mask_bytes = 0 if mask is None else int(np.prod(mask.shape)) * mask.dtype.itemsize
  return cost_estimates(n, cfg.tq, cfg.tk, chunks * chunk, dv, q.dtype.itemsize, mask_bytes,
                        cfg.backward)


def _vmem(cfg: Config, q, values) -> int:
  _, chunks, chunk, dv = _sizes(q, values)
  need = tpu_vmem_bytes(cfg.tq, cfg.tk, chunks * chunk, dv, cfg.blocks, cfg.masked,
                        q.dtype.itemsize)
  return min(TPU_VMEM_LIMIT_BYTES, max(32 * 2 ** 20, need + need // 4))


# ----------------------------------------------------------------------------
# The custom VJP on padded, chunk-major operands.


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def fused_attention(q, k, values, v, mask, cfg: Config):
  return _forward_call(cfg, q, k, values, v, mask)[0]


def _fused_attention_forward(q, k, values, v, mask, cfg: Config):
  out, lse = _forward_call(cfg, q, k, values, v, mask)
  return out, (q, k, values, v, mask, out, lse)


def _fused_attention_backward(cfg: Config, residuals, d_out):
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


fused_attention.defvjp(_fused_attention_forward, _fused_attention_backward)
