"""The additive suite: chunked vs naive additive attention, forward+backward.

The library's `scores.additive` never holds the `[B, Tq, Tk, a]` tanh block
that `scores.additive_naive` builds; this suite shows it as compiled temp
memory over T (every length of `settings.additive_seq_lens`) and as time (up
to `settings.additive_time_max_len`; longer ones are `compiled_only`). Both
are checked against `bm.naive_attention` before they are timed.

Glossary: B batch, T sequence length (Tq = Tk), d query / key / value size
(64), a attention size.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from attention_jax import benchmarking as bm
from attention_jax import pallas_additive
from attention_jax import scores as scores_lib
from experiments.benchmarks import resume
from experiments.benchmarks import timing
from experiments.benchmarks.settings import Settings

HEAD_DIM = 64  # d of the queries, keys and values
SCORE_FNS = {"additive_chunked": scores_lib.additive, "additive_naive": scores_lib.additive_naive}
# The fused Pallas kernels (`attention_jax/pallas_additive.py`) give the context
# directly. Timed on an accelerator only: on a CPU they run in Pallas's
# interpret mode, a test path whose speed means nothing.
PALLAS_IMPL = "additive_pallas"


def impls_for(backend: str) -> tuple[str, ...]:
  """The implementations the suite compiles and times on `backend`."""
  return tuple(SCORE_FNS) + ((PALLAS_IMPL,) if backend in ("gpu", "tpu") else ())
_ARGNUMS = (0, 1, 2, 3, 4, 5)  # gradients w.r.t. q, k, values, w_q, w_k, v_att


def _loss(score_fn: Callable | None) -> Callable:
  """sum(attention context · cot) with `score_fn` scores, the Pallas kernels
  (`PALLAS_IMPL`) or the naive reference (None)."""

  def loss(q, k, values, w_q, w_k, v_att, cot):
    if score_fn == PALLAS_IMPL:
      context = pallas_additive.additive_attention(q, k, values, w_q, w_k, v_att)
    elif score_fn is None:
      context = bm.naive_attention(q, k, values, score="additive",
                                   params={"w_q": w_q, "w_k": w_k, "v": v_att})
    else:
      context, _ = aj.attend(score_fn(q, k, w_q, w_k, v_att), values)  # [B, T, d]
    return jnp.sum(context * cot)

  return loss


def _weights(keys, attention_dim: int):
  """`(w_q [d, a], w_k [d, a], v_att [a])`."""
  d, a = HEAD_DIM, attention_dim
  return (jax.random.normal(keys[0], (d, a)) / math.sqrt(d),
          jax.random.normal(keys[1], (d, a)) / math.sqrt(d),
          jax.random.normal(keys[2], (a,)) / math.sqrt(a))


def _reference(args, limit: int) -> tuple[Any, str]:
  """`(gradients, name)` of the first reference that compiles within `limit`
  bytes: the naive form (formula by formula), else the chunked library form,
  itself tested against the naive one at small sizes; `(None, why)` if neither."""
  failures = []
  for name, score_fn in (("naive", None), ("additive_chunked", SCORE_FNS["additive_chunked"])):
    try:
      compiled, _ = bm.compile_fn(jax.grad(_loss(score_fn), argnums=_ARGNUMS), *args)
    except Exception as e:  # pylint: disable=broad-except
      failures.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
      continue
    size = timing.compiled_bytes(bm.memory_stats(compiled))
    if size > limit:
      failures.append(f"{name}: {size / 2 ** 30:.1f} GiB over the limit")
      continue
    return jax.tree.map(np.asarray, compiled(*args)), name
  return None, "; ".join(failures)


def run(settings: Settings, write: Callable[[dict], None],
        progress: resume.Progress | None = None) -> None:
  """Chunked vs naive additive attention, forward+backward: temp memory and time
  (the lengths `progress.pending` says are not measured yet)."""
  progress = progress or resume.Progress((), {})
  limit = timing.memory_limit_bytes(settings.memory_limit_gb)
  b, a, d = settings.additive_batch, settings.additive_dim, HEAD_DIM
  keys = jax.random.split(jax.random.PRNGKey(settings.seed + 7), 8)
  weights = _weights(keys, a)
  for t in sorted(settings.additive_seq_lens):
    case = {"suite": "additive", "mode": "fwd_bwd", "dtype": "float32", "batch": b,
            "seq_len": t, "attention_dim": a, "head_dim": d}
    impls = progress.pending(case, impls_for(jax.default_backend()))
    if not impls:
      continue
    q, k, values, cot = (jax.random.normal(key, (b, t, d)) for key in keys[3:7])  # [B, T, d]
    args = (q, k, values, *weights, cot)
    timed = t <= settings.additive_time_max_len
    reference, reference_name = (_reference(args, limit) if timed else (None, None))
    if timed and reference is None:
      for impl in impls:
        write({**case, "impl": impl, "status": "skipped",
               "reason": f"no reference fits: {reference_name}; unverified forms are not timed"})
      continue
    ready = {}  # impl -> (row, call, first call seconds); timed interleaved below
    for impl in impls:
      score_fn = SCORE_FNS.get(impl, impl)
      row = {**case, "impl": impl}
      if timed:
        row["reference"] = reference_name
      try:
        compiled, compile_s = bm.compile_fn(jax.grad(_loss(score_fn), argnums=_ARGNUMS), *args)
      except Exception as e:  # pylint: disable=broad-except
        # A GPU's compiler fails on the naive form at T >= 1024 (XLA's autotuner
        # allocates its 128 GiB tanh block): a row says so, the other forms go on.
        write({**row, "status": "skipped",
               "reason": f"compile failed: {type(e).__name__}: {str(e)[:200]}"})
        continue
      memory = bm.memory_stats(compiled)
      row.update(memory, compile_s=compile_s)
      size = timing.compiled_bytes(memory)
      if not timed or size > limit:
        why = (f"T > --additive_time_max_len={settings.additive_time_max_len}" if not timed
               else f"compiled memory {size / 2 ** 30:.1f} GiB exceeds the limit")
        write({**row, "status": "compiled_only", "reason": why})
        continue
      start = time.perf_counter()
      grads = jax.block_until_ready(compiled(*args))
      first = time.perf_counter() - start
      try:
        row["max_abs_err"] = bm.verify_close(jax.tree.map(np.asarray, grads), reference,
                                             rtol=bm.default_tolerance("float32"), name=impl)
      except bm.KernelMismatchError as e:
        write({**row, "status": "refused", "reason": str(e)})
        continue
      del grads
      ready[impl] = (row, functools.partial(compiled, *args), first)
    if not ready:
      continue
    timings, other_load, attempts = timing.time_ready(ready, settings,
                                                      warmup=min(settings.warmup, 1))
    for impl, (row, _, _) in ready.items():
      write({**row, "status": "ok", **timing.timing_fields(timings[impl]),
             "other_load_cores": other_load, "attempts": attempts})
