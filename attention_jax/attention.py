"""Masked softmax attention: `attend` and the high-level `attention` helper.

    scores  = f(query, keys)                  # [..., Tq, Tk]
    weights = softmax(scores | mask)          # [..., Tq, Tk], float32
    context = weights @ values                # [..., Tq, dv]

Shape glossary: B batch, H heads, Tq query length, Tk key length, d feature
size, dv value size. Leading axes (`...`) are any mix of batch and head axes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import _validate
from attention_jax import blockwise
from attention_jax import registry
from attention_jax import scores as scores_lib
from attention_jax.score_kinds import DotProduct

__all__ = ["attend", "attention", "compute_scores", "select_implementation", "IMPLEMENTATIONS",
           "structured_mask"]

IMPLEMENTATIONS = ("auto", "plain", "xla", "cudnn", "blockwise", "pallas")

# On CPUs `auto` takes `blockwise` from this many keys on, `plain` below it.
# Measured with experiments/kernels/run.py on a 2-core Xeon (float32, B = H = 8,
# D = 64, forward+backward, wall clock): blockwise is 1.7x faster than plain at
# Tk = 512 and 2x at 1024, but plain is faster at 128 and 256 (36 vs 49 ms at
# 256: the tiles are too small to keep both cores busy). Between 256 and 512
# nothing was measured, so plain stays. jax.nn.dot_product_attention('xla') was
# never faster than plain on CPU, so `auto` does not use it there.
_BLOCKWISE_MIN_KEYS = 512


def attend(scores: jax.Array, values: jax.Array, mask: jax.Array | None = None):
  """Masked softmax over the key axis, then the weighted sum of the values.

  Args:
    scores: `[..., Tq, Tk]`, any float dtype.
    values: `[..., Tk, dv]`; leading axes broadcast with `scores`.
    mask: optional bool broadcastable to `scores`; True = may attend.

  Returns:
    `(context [..., Tq, dv]` in `values.dtype`, `weights [..., Tq, Tk]` float32`)`.

  The softmax always runs in float32. A query row whose keys are *all* masked
  gets all-zero weights and therefore a zero context, rather than the uniform
  average a `-inf`/`finfo.min` fill would give: "attend to nothing" is the
  honest answer for such a row (e.g. a padding query), and it keeps both the
  forward and the backward pass free of NaN (masked logits are replaced by a
  finite value *before* `exp`, so no `0 * inf` appears in the gradient).
  """
  scores, values = _validate.as_float(scores, "scores"), _validate.as_float(values, "values")
  _validate.rank_at_least(scores, "scores", 2)
  _validate.rank_at_least(values, "values", 2)
  _validate.nonempty_axis(scores, "scores", -1, "key (Tk)")
  _validate.same_size(scores.shape[-1], values.shape[-2], "scores (Tk axis)",
                      "values (Tk axis)", scores.shape, values.shape)
  _validate.broadcast_shapes({"scores (leading axes)": scores.shape[:-2],
                              "values (leading axes)": values.shape[:-2]})
  mask = _validate.mask_within(mask, scores.shape)

  logits = scores.astype(jnp.float32)  # [..., Tq, Tk]
  if mask is None:
    weights = jax.nn.softmax(logits, axis=-1)
  else:
    # Max over valid keys only; rows with no valid key use 0 (any finite value).
    row_max = jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True)
    row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    safe = jnp.where(mask, logits, row_max)  # finite everywhere
    unnorm = jnp.where(mask, jnp.exp(safe - row_max), 0.0)  # [..., Tq, Tk]
    total = jnp.sum(unnorm, axis=-1, keepdims=True)
    weights = unnorm / jnp.where(total > 0, total, 1.0)
  context = jnp.matmul(weights.astype(values.dtype), values,
                       preferred_element_type=jnp.float32)  # [..., Tq, dv]
  return context.astype(values.dtype), weights


def compute_scores(score: str, query, keys, params: Mapping[str, Any] | None = None):
  """Scores by name (`registry.FUNCTION_SCORES`): the entry's `function` of
  query and keys, with the weights of a parametric score in `params` (its
  `function_params`, e.g. `w` of `general`, `w_q`, `w_k`, `v` of `additive`;
  `function_options` where given, e.g. `beta` of `cosine`)."""
  spec = _function_score(score)
  params = dict(params or {})
  missing = [p for p in spec.function_params if p not in params]
  if missing:
    raise ValueError(f"score {score!r} needs `params` {missing}; got {sorted(params)}.")
  taken = spec.function_params + spec.function_options
  return spec.function(query, keys, **{p: params[p] for p in taken if p in params})


def _function_score(score: str) -> registry.Score:
  """The registry entry of a pure score; a ValueError naming `score` otherwise."""
  spec = registry.SCORES.get(score)
  if spec is None or spec.function is None:
    raise ValueError(
        f"`score` must be one of {registry.FUNCTION_SCORES}, got {score!r}.")
  return spec


def _cudnn_applies(q, mask) -> bool:
  """Whether `auto` asks jax.nn for cuDNN flash attention (`q [B, T, H, d]`).

  jax.nn.dot_product_attention's own default (`implementation=None`) is XLA's
  unfused attention on every backend, so `auto` names cuDNN itself on NVIDIA
  GPUs, for the inputs its flash kernel takes: float16 / bfloat16, head size
  a multiple of 8 up to 128, and no *dense* mask (a dense mask would reach
  cuDNN as a `[.., Tq, Tk]` bias read from memory). Causal and length-padding
  masks given as `causal` / `query_lengths` / `key_lengths` are no dense
  mask: cuDNN applies them inside its kernel. Everything else keeps XLA's.
  """
  return (jax.default_backend() == "gpu" and mask is None
          and q.dtype in (jnp.bfloat16, jnp.float16)
          and q.shape[-1] % 8 == 0 and q.shape[-1] <= 128)


def _cudnn_attention(q, k, v, *, scale, is_causal, query_seq_lengths, key_value_seq_lengths):
  """cuDNN flash attention on `[B, T, H, d]` inputs (one place, so tests can replace it)."""
  return jax.nn.dot_product_attention(
      q, k, v, scale=scale, is_causal=is_causal, query_seq_lengths=query_seq_lengths,
      key_value_seq_lengths=key_value_seq_lengths, implementation="cudnn")


# (argument shapes and dtypes, causal, scale, probe sharding) -> whether cuDNN
# attention compiled there, forward and backward (`_cudnn_compiles`).
_CUDNN_COMPILES: dict[tuple, bool] = {}

# Where `_cudnn_compiles` compiles its probe: None, the default device (the
# GPU the program runs on). A program compiled ahead of time for a device
# this host only describes (experiments/compile_check/run.py: an H100 target on
# a CPU host) sets a sharding on that device, so that `auto` decides as it
# would there; compiled for the host's CPU the probe always fails.
cudnn_probe_sharding: jax.sharding.Sharding | None = None


def _on_its_own(fn):
  """`fn()` in a thread of its own: outside the program being traced, whose
  mesh context (a `shard_map` over the members' devices) is thread-local and
  would refuse a program for one device (jax 0.11.2: "use_abstract_mesh
  cannot change the size of the mesh")."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    return pool.submit(fn).result()


def _cudnn_compiles(q, k, v, *, scale, is_causal, q_len, kv_len) -> bool:
  """Whether cuDNN attention compiles for these shapes, forward and backward.

  A shape rule cuDNN refuses raises while tracing, but other refusals (an
  older cuDNN, an engine it lacks, a backward it cannot build) appear only
  when XLA compiles the whole program, too late to choose another kernel. So
  `auto` first compiles a probe of the same shapes on its own (once per
  configuration) and keeps XLA's kernel if that fails in any way.
  """
  sharding = cudnn_probe_sharding
  spec = lambda x: None if x is None else jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                               sharding=sharding)
  args = tuple(spec(x) for x in (q, k, v, q_len, kv_len))
  key = (args, is_causal, None if scale is None else float(scale), sharding)
  if key not in _CUDNN_COMPILES:

    def loss(q, k, v, q_len, kv_len):
      out = _cudnn_attention(q, k, v, scale=scale, is_causal=is_causal,
                             query_seq_lengths=q_len, key_value_seq_lengths=kv_len)
      return jnp.sum(out.astype(jnp.float32))

    try:
      _on_its_own(lambda: jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile())
      _CUDNN_COMPILES[key] = True
    except Exception:  # a refusal at trace, lowering or compile time  # pylint: disable=broad-except
      _CUDNN_COMPILES[key] = False
  return _CUDNN_COMPILES[key]


def _flat_lengths(lengths, batch):
  """Lengths over the batch axes `[*batch]` -> `[prod(batch)]` int32 (None stays None)."""
  if lengths is None:
    return None
  return jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), batch).reshape(-1)


def _fused(query, keys, values, mask, scale, implementation, *, causal=False,
           query_lengths=None, key_lengths=None):
  """`jax.nn.dot_product_attention` on `[..., T, d]` inputs (any leading axes).

  `causal` and the lengths reach jax.nn as `is_causal` and sequence lengths
  (which cuDNN applies inside its kernel), `mask` as a dense boolean mask.
  """
  lead = jnp.broadcast_shapes(query.shape[:-2], keys.shape[:-2], values.shape[:-2])
  tq, tk = query.shape[-2], keys.shape[-2]
  if len(lead) >= 2:  # [..., H, T, d]: the last leading axis is the head axis.
    batch, heads = lead[:-1], lead[-1]
  else:
    batch, heads = lead, 1

  def to_bthd(x):  # [..., H, T, d] -> [B, T, H, d]
    x = jnp.broadcast_to(x, lead + x.shape[-2:]).reshape((-1, heads) + x.shape[-2:])
    return jnp.swapaxes(x, 1, 2)

  q, k, v = to_bthd(query), to_bthd(keys), to_bthd(values)
  q_len, kv_len = _flat_lengths(query_lengths, batch), _flat_lengths(key_lengths, batch)
  m = None
  if mask is not None:
    # [B or 1, H or 1, Tq or 1, Tk or 1]: broadcast axes stay size 1, so a
    # causal [T, T] mask is not copied B·H times (16 GiB at B·H = 64, T = 16k).
    m = jnp.asarray(mask)
    m = m.reshape((1,) * (len(lead) + 2 - m.ndim) + m.shape)
    head_m = m.shape[-3] if len(lead) >= 2 else 1
    batch_m = m.shape[:len(batch)]
    if any(s != 1 for s in batch_m):
      m = jnp.broadcast_to(m, batch + m.shape[len(batch):])
    m = m.reshape((-1 if batch_m else 1, head_m) + m.shape[-2:])
    if implementation == "cudnn":
      # cuDNN takes the mask as a bias that must span both sequence axes;
      # a [B, 1, 1, Tk] padding mask otherwise fails with "Bias must have
      # same seq length as QKV" (jax-ml/jax#28974).
      m = jnp.broadcast_to(m, m.shape[:2] + (tq, tk))
  structure = dict(is_causal=causal, query_seq_lengths=q_len, key_value_seq_lengths=kv_len)
  if (implementation == "auto" and _cudnn_applies(q, m)
      and _cudnn_compiles(q, k, v, scale=scale, is_causal=causal, q_len=q_len, kv_len=kv_len)):
    out = _cudnn_attention(q, k, v, scale=scale, **structure)
  else:
    out = jax.nn.dot_product_attention(
        q, k, v, mask=m, scale=scale, **structure,
        implementation=None if implementation == "auto" else implementation)
  out = jnp.swapaxes(out, 1, 2).reshape(lead + (tq, values.shape[-1]))  # [..., Tq, dv]
  # The convention of `attend`: a query with no valid key gets a zero context
  # (jax.nn gives a fully masked row the mean of the values; padded queries
  # it already zeroes).
  if mask is not None:  # with `causal` and the lengths: a row may lose its last key to them
    every = combine_masks(jnp.asarray(mask), structured_mask(
        tq, tk, causal=causal, query_lengths=query_lengths, key_lengths=key_lengths,
        heads=len(lead) >= 2))
    out = out * jnp.any(every, axis=-1, keepdims=True).astype(out.dtype)
  elif key_lengths is not None:
    has_keys = jnp.broadcast_to(jnp.asarray(key_lengths), batch) > 0  # [*batch]
    out = out * has_keys.reshape(batch + (1,) * (len(lead) - len(batch) + 2)).astype(out.dtype)
  return out


def _check_lengths(lengths, name: str, batch: tuple, size: int):
  """`lengths` as an int array of shape `batch` with values in [0, size]; a
  ValueError naming `name` otherwise (values only where they are concrete)."""
  if lengths is None:
    return None
  lengths = jnp.asarray(lengths)
  _validate.integer(lengths, name)
  if tuple(lengths.shape) != tuple(batch):
    raise ValueError(f"`{name}` must have the batch axes' shape {tuple(batch)} (the "
                     f"leading axes before the head axis), got {tuple(lengths.shape)}.")
  if not isinstance(lengths, jax.core.Tracer) and lengths.size:
    values = np.asarray(lengths)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high > size:
      raise ValueError(f"`{name}` must lie in [0, {size}], got values in [{low}, {high}].")
  return lengths


def combine_masks(a, b):
  """`a & b` where both are given, else the one given (or None)."""
  if a is None or b is None:
    return a if b is None else b
  return jnp.logical_and(a, b)


def structured_mask(tq: int, tk: int, *, causal: bool = False, query_lengths=None,
                    key_lengths=None, heads: bool = True):
  """The dense boolean mask that `causal` and the lengths stand for, or None.

  Args:
    tq, tk: query and key lengths.
    causal: query i may attend key j only where j <= i (aligned at the first
      position: `masks.causal` for tq = tk, jax.nn's `is_causal`).
    query_lengths / key_lengths: int arrays over the batch axes `[*batch]`:
      the positions at or after a sentence's length are padding (padded at
      the end, as the batches of `attention_jax.data` are). A padded query
      attends to nothing.
    heads: whether the scores have a head axis after the batch axes.

  Returns:
    bool `[*batch, 1, Tq, Tk]` (without `heads`, no head axis; `[Tq, Tk]`
    for `causal` alone), True = may attend.
  """
  out = jnp.tril(jnp.ones((tq, tk), dtype=jnp.bool_)) if causal else None  # [Tq, Tk]
  head = (1,) if heads else ()
  for lengths, size, axis_shape in ((query_lengths, tq, (tq, 1)), (key_lengths, tk, (1, tk))):
    if lengths is None:
      continue
    lengths = jnp.asarray(lengths)
    valid = jnp.arange(size) < lengths[..., None]  # [*batch, T]
    valid = valid.reshape(lengths.shape + head + axis_shape)
    out = valid if out is None else out & valid
  return out


@dataclasses.dataclass(frozen=True)
class MaskStructure:
  """Causal and length-padding masks by their structure: `attention`'s
  `causal`, `query_lengths` and `key_lengths` as one value, for a caller that
  passes a single `mask` along (`layers.MultiHeadAttention.attend`). Handed
  to the fused kernel, cuDNN applies them inside its kernel; a dense mask
  would reach it as a `[.., Tq, Tk]` bias and keep `auto` on XLA's kernel.
  The lengths assume padding at the end, as `attention_jax.data` batches it."""
  causal: bool = False
  query_lengths: jax.Array | None = None  # int [B]
  key_lengths: jax.Array | None = None  # int [B]

  def arguments(self) -> dict[str, Any]:
    """The keyword arguments of `attention` it stands for."""
    return dict(causal=self.causal, query_lengths=self.query_lengths,
                key_lengths=self.key_lengths)

  def dense(self, tq: int, tk: int):
    """bool `[B, 1, Tq, Tk]` (`[Tq, Tk]` for `causal` alone): `structured_mask`."""
    return structured_mask(tq, tk, **self.arguments())


def _dot_product(score, query, keys, params) -> DotProduct | None:
  """The dot-product form of `score` (`registry.Score.dot_product`) if it
  serves these inputs, else None (as for a name the registry lacks)."""
  spec = registry.SCORES.get(score)
  form = None if spec is None or spec.function is None else spec.dot_product
  if form is None or not form.serves(query, keys, dict(params or {})):
    return None
  return form


def _pallas_serves(score: str, params, return_weights: bool) -> bool:
  """Whether the Pallas additive kernels (`pallas_additive`) compute `score`
  for these inputs: a score whose pure function is `scores.additive` (the
  function the kernels fuse), with `w_q [dq, a]`, `w_k [dk, a]`, `v [a]`,
  without the weights (which they never form)."""
  spec = registry.SCORES.get(score)
  if spec is None or spec.function is not scores_lib.additive or return_weights:
    return False
  params = dict(params or {})
  return (all(p in params for p in ("w_q", "w_k", "v"))
          and jnp.ndim(params["w_q"]) == jnp.ndim(params["w_k"]) == 2
          and jnp.ndim(params["v"]) == 1)


def _pallas_wins(query, keys, params) -> bool:
  """`auto`'s rule for the Pallas additive kernels (`pallas_additive.wins`:
  where the plain path would chunk its tanh block, and within a TPU's VMEM)."""
  from attention_jax import pallas_additive  # pylint: disable=g-import-not-at-top
  lead = jnp.broadcast_shapes(query.shape[:-2], keys.shape[:-2])
  return pallas_additive.wins(math.prod(lead), query.shape[-2], keys.shape[-2],
                              jnp.shape(params["w_q"])[-1], jax.default_backend())


def select_implementation(score: str, implementation: str, query, keys, values, *,
                          params: Mapping[str, Any] | None = None,
                          return_weights: bool = False) -> str:
  """The one switch that picks the kernel of `attention` for these inputs
  (`layers.MultiHeadAttention` asks it too, before handing its heads over).

  Returns:
    'plain' (scores + `attend`: any score, the weights available),
    'blockwise' (`blockwise.dot_product_attention`: the dot-product family,
    no weights), 'fused' (`jax.nn.dot_product_attention` with the
    requested 'xla' / 'cudnn', or under 'auto' cuDNN flash attention where
    `_cudnn_applies` (which also looks at the mask), else XLA's kernel:
    `dot` / `scaled_dot` with dq == dk == dv, no weights), or 'pallas'
    (`pallas_additive`: `additive` with 2-D `w_q` / `w_k`, no weights; on
    a CPU in Pallas's interpret mode, for tests). `auto` chooses fused off
    CPUs, pallas off CPUs by `_pallas_wins` (a memory rule), and on CPUs
    blockwise from `_BLOCKWISE_MIN_KEYS` keys on (measured: the constant's
    comment), plain otherwise; it never chooses pallas on a CPU.

  Raises:
    ValueError: an explicit `implementation` that cannot serve the inputs,
      naming the score and the shapes.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"`implementation` must be one of {IMPLEMENTATIONS}, got {implementation!r}.")
  # jax.nn.dot_product_attention needs one feature size for q, k and v, and
  # computes a score whose entry names itself as `fused` (dot, scaled_dot).
  spec = registry.SCORES.get(score)
  fusable = (spec is not None and spec.fusable and not return_weights
             and query.shape[-1] == keys.shape[-1] == values.shape[-1])
  if implementation in ("xla", "cudnn"):
    if not fusable:
      raise ValueError(
          f"`implementation={implementation!r}` supports score 'dot'/'scaled_dot' "
          f"with dq == dk == dv and no return_weights; got score={score!r}, "
          f"shapes q {tuple(query.shape)}, k {tuple(keys.shape)}, "
          f"v {tuple(values.shape)}, return_weights={return_weights}.")
    return "fused"
  blockwise_ok = not return_weights and _dot_product(score, query, keys, params) is not None
  if implementation == "blockwise":
    if not blockwise_ok:
      raise ValueError(
          "`implementation='blockwise'` supports scores 'dot', 'scaled_dot', 'general' "
          "and 'cosine' (beta scalar or [..., Tq, 1]) without return_weights; got "
          f"score={score!r}, q {tuple(query.shape)}, k {tuple(keys.shape)}, "
          f"return_weights={return_weights}.")
    return "blockwise"
  pallas_ok = _pallas_serves(score, params, return_weights)
  if implementation == "pallas":
    if not pallas_ok:
      raise ValueError(
          "`implementation='pallas'` supports score 'additive' with params w_q [dq, a], "
          f"w_k [dk, a] and v [a], without return_weights; got score={score!r}, "
          f"params {sorted(dict(params or {}))}, return_weights={return_weights}.")
    return "pallas"
  if implementation == "plain":
    return "plain"
  if jax.default_backend() == "cpu":  # auto on a CPU
    return "blockwise" if blockwise_ok and keys.shape[-2] >= _BLOCKWISE_MIN_KEYS else "plain"
  if pallas_ok and _pallas_wins(query, keys, params):
    return "pallas"
  return "fused" if fusable else "plain"


def attention(query: jax.Array, keys: jax.Array, values: jax.Array, *,
              score: str = "scaled_dot", params: Mapping[str, Any] | None = None,
              mask: jax.Array | None = None, causal: bool = False,
              query_lengths: jax.Array | None = None, key_lengths: jax.Array | None = None,
              implementation: str = "auto", return_weights: bool = False):
  """`attend(f(query, keys), values, mask)` with the score function chosen by name.

  Args:
    query: `[..., Tq, dq]`; for multi-head inputs use `[B, H, Tq, d]`.
    keys: `[..., Tk, dk]`.
    values: `[..., Tk, dv]`.
    score: a name from `registry.FUNCTION_SCORES`.
    params: weights of parametric scores (see `compute_scores`).
    mask: bool broadcastable to `[..., Tq, Tk]`; True = may attend.
    causal: query i attends keys j <= i only. With the lengths below it is
      the way to pass causal and padding masks so that they reach cuDNN's
      fused kernel as `is_causal` / sequence lengths instead of a dense
      `[.., Tq, Tk]` mask (`structured_mask` is their dense form, which the
      other kernels use). All given masks apply together (logical AND).
    query_lengths / key_lengths: int `[*batch]` over the leading axes before
      the head axis (all leading axes for 3-D inputs): positions at or after
      the length are padding; a padded query gets a zero context.
    implementation: `plain` (scores + `attend`), `pallas` (`additive`
      only: `pallas_additive`'s fused kernels; `auto` takes them on a TPU
      or GPU where the tanh block exceeds 2**22 elements), `xla` / `cudnn`
      (`jax.nn.dot_product_attention`, dot-product scores only), or `auto`:
      the fused kernel for `dot` / `scaled_dot` when weights are not requested
      and dq == dk == dv (cuDNN flash attention on NVIDIA GPUs for unmasked
      float16/bfloat16 inputs with head size <= 128, else XLA's), else
      `plain`. On CPUs, where the fused XLA kernel is slower than `plain`,
      every score `blockwise` serves takes it from Tk = 512 keys on, and the
      rest takes `plain`. `blockwise` (`blockwise.dot_product_attention`, a
      tiled kernel with its own backward) serves `dot`, `scaled_dot`,
      `general` and `cosine` with a scalar or per-query `beta`, without
      return_weights.
    return_weights: also return the float32 weights (forces `plain`).

  Returns:
    context `[..., Tq, dv]` in the values' dtype, or `(context, weights)`.
    Integer / bool inputs are promoted to float32 first; a feature axis of
    size 0 or no keys (Tk = 0) is a ValueError naming the argument.
  """
  query, keys, values = (_validate.as_float(x, n)
                         for x, n in ((query, "query"), (keys, "keys"), (values, "values")))
  for name, x in (("query", query), ("keys", keys), ("values", values)):
    _validate.rank_at_least(x, name, 2)
  _validate.nonempty_axis(query, "query", -1, "feature")
  _validate.nonempty_axis(keys, "keys", -1, "feature")
  _validate.nonempty_axis(keys, "keys", -2, "key (Tk)")
  kernel = select_implementation(score, implementation, query, keys, values,
                                 params=params, return_weights=return_weights)
  scores = jax.eval_shape(lambda: compute_scores(score, query, keys, params))
  _validate.same_size(keys.shape[-2], values.shape[-2], "keys (Tk axis)",
                      "values (Tk axis)", keys.shape, values.shape)
  # Checked here too, so the fused path names `values` like `attend` does.
  _validate.broadcast_shapes({"query/keys (leading axes)": scores.shape[:-2],
                              "values (leading axes)": values.shape[:-2]})
  mask = _validate.mask_within(mask, scores.shape)
  lead, (tq, tk) = scores.shape[:-2], scores.shape[-2:]
  batch = lead[:-1] if len(lead) >= 2 else lead
  query_lengths = _check_lengths(query_lengths, "query_lengths", batch, tq)
  key_lengths = _check_lengths(key_lengths, "key_lengths", batch, tk)
  if kernel in ("fused", "blockwise"):  # both compute the score as `scale · q' k'ᵀ`
    q, k, scale = registry.SCORES[score].dot_product.operands(query, keys, dict(params or {}))
  if kernel == "fused":
    return _fused(q, k, values, mask, scale, implementation, causal=bool(causal),
                  query_lengths=query_lengths, key_lengths=key_lengths)
  mask = combine_masks(mask, structured_mask(
      tq, tk, causal=bool(causal), query_lengths=query_lengths, key_lengths=key_lengths,
      heads=len(lead) >= 2))
  if kernel == "blockwise":
    return blockwise.dot_product_attention(q, k, values, mask, scale=scale)
  if kernel == "pallas":
    from attention_jax import pallas_additive  # pylint: disable=g-import-not-at-top
    p = dict(params)
    return pallas_additive.additive_attention(query, keys, values, p["w_q"], p["w_k"], p["v"],
                                              mask)
  if query.dtype == jnp.float16 or keys.dtype == jnp.float16:
    # float16 tops out at 65504: scores beyond it would be inf and the softmax
    # NaN, where the fused and blockwise kernels (float32 logits) stay finite.
    query, keys = query.astype(jnp.float32), keys.astype(jnp.float32)
  context, weights = attend(compute_scores(score, query, keys, params), values, mask)
  return (context, weights) if return_weights else context
