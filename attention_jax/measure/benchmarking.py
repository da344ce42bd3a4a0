"""Honest-measurement helpers for attention benchmarks (used by every study that times a kernel or a step).

- FLOPs by the FlashAttention convention: forward `4·B·H·Tq·Tk·D` (two
  matmuls of `2·Tq·Tk·D` per head), halved when causal; forward+backward is
  3.5 × forward (five matmuls in the backward plus the forward's two, of
  which the backward recomputes one).
- Timing: the program is compiled before the clock starts, every call ends
  in `block_until_ready`, warm-up calls are discarded, and the median and the
  spread of several repeats are reported. `timed` is the one clock; training
  steps are timed by `time_steps` (every command that times a step uses it),
  contenders side by side by `time_interleaved`.
- Memory: the compiled program's `memory_analysis()` (temporaries,
  arguments, outputs; available on CPU too) and, where the runtime tracks it,
  the device's peak bytes in use.
- Correctness: a naive float32 einsum reference, each score's `naive` form
  from its registry entry (`naive_comparison` lists every score against
  it); `verify_close` raises `KernelMismatchError` so that a wrong kernel is
  never timed.

Shape glossary: B batch, H heads, Tq / Tk query / key lengths, D head (feature)
size, a additive attention size.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import _validate
from attention_jax.attention import compute_scores
from attention_jax.measure import provenance
from attention_jax import registry

__all__ = [
    "attention_flops", "PEAK_TFLOPS", "dense_peak_tflops", "Timing", "compile_fn",
    "time_interleaved", "CpuSnapshot", "cpu_snapshot",
    "other_cpu_load", "memory_stats", "peak_device_memory",
    "naive_attention", "naive_scores", "naive_comparison", "KernelMismatchError", "max_error",
    "verify_close", "default_tolerance", "machine_description",
    "PEAK_SHAPES", "matmul_rates",
]

FWD_BWD_FACTOR = 3.5

# Dense (no sparsity) peak TFLOP/s per device kind and input dtype, from the
# vendors' data sheets. float32 on NVIDIA tensor-core GPUs is the TF32 rate,
# which is what XLA uses for float32 matmuls at default precision. Keys are
# matched case-insensitively as substrings of `jax.Device.device_kind`; more
# specific patterns come first.
PEAK_TFLOPS: tuple[tuple[str, Mapping[str, float]], ...] = (
    ("h100 pcie", {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0}),
    ("h100", {"bfloat16": 989.0, "float16": 989.0, "float32": 494.7}),  # SXM (HBM3)
    ("h200", {"bfloat16": 989.0, "float16": 989.0, "float32": 494.7}),
    ("gh200", {"bfloat16": 989.0, "float16": 989.0, "float32": 494.7}),
    ("b200", {"bfloat16": 2250.0, "float16": 2250.0, "float32": 1100.0}),
    ("a100", {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}),
    ("l40s", {"bfloat16": 362.0, "float16": 362.0, "float32": 183.0}),
    ("l4", {"bfloat16": 121.0, "float16": 121.0, "float32": 60.0}),
    ("a10g", {"bfloat16": 70.0, "float16": 70.0, "float32": 35.0}),
    ("v100", {"float16": 125.0, "float32": 15.7}),
    ("tpu v6", {"bfloat16": 918.0}),
    ("tpu v5p", {"bfloat16": 459.0}),
    ("tpu v5 lite", {"bfloat16": 197.0}),
    ("tpu v5e", {"bfloat16": 197.0}),
    ("tpu v4", {"bfloat16": 275.0}),
)


def dense_peak_tflops(device_kind: str, dtype) -> float | None:
  """Peak dense TFLOP/s of `device_kind` for `dtype`, or None if unknown (e.g. CPUs)."""
  name = jnp.dtype(dtype).name
  kind = device_kind.lower()
  for pattern, peaks in PEAK_TFLOPS:
    if pattern in kind:
      return peaks.get(name)
  return None


def attention_flops(batch: int, heads: int, tq: int, tk: int, head_dim: int, *,
                    causal: bool = False, backward: bool = False) -> float:
  """FlashAttention-convention FLOPs of one attention call.

  Forward `4·B·H·Tq·Tk·D`, halved when `causal`; `backward=True` counts
  forward+backward as 3.5 × forward.
  """
  for name, value in (("batch", batch), ("heads", heads), ("tq", tq), ("tk", tk),
                      ("head_dim", head_dim)):
    _validate.positive_int(value, name)
  flops = 4.0 * batch * heads * tq * tk * head_dim
  if causal:
    flops /= 2
  return flops * (FWD_BWD_FACTOR if backward else 1.0)


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall-clock seconds of one call: median and spread over `repeats` calls."""
  median_s: float
  min_s: float
  max_s: float
  iqr_s: float  # interquartile range: the spread that ignores one-off hiccups
  repeats: int
  times_s: tuple[float, ...]

  @classmethod
  def from_times(cls, times: Sequence[float]) -> "Timing":
    if not times:
      raise ValueError("`times` must hold at least one measurement, got none.")
    ts = sorted(float(t) for t in times)
    q1, q3 = (np.percentile(ts, [25, 75]) if len(ts) > 1 else (ts[0], ts[0]))
    return cls(median_s=statistics.median(ts), min_s=ts[0], max_s=ts[-1],
               iqr_s=float(q3 - q1), repeats=len(ts), times_s=tuple(ts))


# Matrix products [M, K] x [K, N] that `matmul_rates` times: large squares (the
# machine's peak), the quick RNN's hoisted projections over a whole batch of
# sentences (64 x 32 rows) and one decoder step of it (64 rows).
PEAK_SHAPES: tuple[tuple[int, int, int], ...] = (
    (2048, 2048, 2048), (4096, 384, 384), (2048, 128, 2000), (64, 384, 384),
    (64, 128, 384))


def matmul_rates(shapes=PEAK_SHAPES, dtype=jnp.float32, *, repeats: int = 7
                 ) -> dict[tuple[int, int, int], float]:
  """Measured FLOP/s of jitted `x @ w` for each `(M, K, N)` in `shapes`.

  2·M·K·N FLOPs per call over the median time of `repeats` interleaved calls
  (compiled first; `time_interleaved`). The best of them is the machine's
  matmul peak as JAX reaches it with the threads this process was given.
  """
  calls, flops = {}, {}
  for i, (m, k, n) in enumerate(shapes):
    for name, value in (("M", m), ("K", k), ("N", n)):
      _validate.positive_int(value, f"shapes[{i}].{name}")
    x = jax.random.normal(jax.random.key(i), (m, k), dtype)
    w = jax.random.normal(jax.random.key(i + 1000), (k, n), dtype)
    compiled = jax.jit(jnp.matmul).lower(x, w).compile()
    calls[(m, k, n)] = functools.partial(compiled, x, w)
    flops[(m, k, n)] = 2.0 * m * k * n
  timings = time_interleaved(calls, warmup=2, repeats=repeats)
  return {shape: flops[shape] / timings[shape].median_s for shape in calls}


def compile_fn(fn: Callable, *args, static_argnums=()) -> tuple[Any, float]:
  """`(compiled, seconds)`: `fn` jitted, lowered and compiled for `args`, untimed later."""
  start = time.perf_counter()
  compiled = jax.jit(fn, static_argnums=static_argnums).lower(*args).compile()
  return compiled, time.perf_counter() - start


def time_interleaved(calls: Mapping[str, Callable[[], Any]], *, warmup: int = 2,
                     repeats: int = 10) -> dict[str, Timing]:
  """Times several zero-argument calls in rounds, one call of each per round.

  The order rotates from round to round. Load from other processes on a
  shared machine then falls on every contender alike instead of on whichever
  happened to run during the busy seconds, which keeps their ratios fair.
  Each call's result goes through `jax.block_until_ready` (a no-op for
  non-JAX values such as PyTorch tensors, which are computed synchronously).
  """
  repeats = _validate.positive_int(repeats, "repeats")
  if not calls:
    raise ValueError("`calls` must name at least one callable, got none.")
  names = list(calls)
  for name in names:
    for _ in range(warmup):
      jax.block_until_ready(calls[name]())
  times = {name: [] for name in names}
  for r in range(repeats):
    shift = r % len(names)
    for name in names[shift:] + names[:shift]:
      times[name].append(timed(calls[name])[1])
  return {name: Timing.from_times(ts) for name, ts in times.items()}


def timed(call: Callable[[], Any]) -> tuple[Any, float, float]:
  """`(result, wall seconds, CPU seconds of this process)` of `call()`, its
  result waited for (`jax.block_until_ready`; a NumPy value passes through).

  The one clock of every timing here: JAX dispatches work asynchronously, so
  a timer that does not wait measures the dispatch, and the next call's wait
  is billed to the wrong call. The CPU time says how much of a core the call
  had, which the wall time alone hides on a core another process shares.
  """
  start, cpu_start = time.perf_counter(), time.process_time()
  result = jax.block_until_ready(call())
  return result, time.perf_counter() - start, time.process_time() - cpu_start


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds of each timed step, by the wall clock and by this process's CPU clock."""
  wall_s: tuple[float, ...]
  cpu_s: tuple[float, ...]

  @property
  def median_s(self) -> float:
    return statistics.median(self.wall_s)

  @property
  def total_s(self) -> float:
    return sum(self.wall_s)

  @property
  def cpu_median_s(self) -> float:
    return statistics.median(self.cpu_s)

  @property
  def cpu_total_s(self) -> float:
    return sum(self.cpu_s)


def time_steps(step: Callable[[int], Any], steps: int, *, warmup: int = 0) -> StepTimes:
  """The step timer of every command that times training steps: calls
  `step(i)` for i = 0 .. warmup + steps - 1, one after the other, each waited
  for (`timed`), and returns the times of the last `steps` calls.

  The step is a function of its index so that the caller says what each call
  does (which batch, which random key, which step number); the first `warmup`
  calls run and are waited for the same way but not kept (compilation,
  caches).
  """
  steps = _validate.positive_int(steps, "steps")
  if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
    raise ValueError(f"`warmup` must be an integer >= 0, got {warmup!r}.")
  wall, cpu = [], []
  for i in range(warmup + steps):
    _, wall_s, cpu_s = timed(functools.partial(step, i))
    if i >= warmup:
      wall.append(wall_s)
      cpu.append(cpu_s)
  return StepTimes(tuple(wall), tuple(cpu))


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
  """Wall clock, CPU seconds of every core (Linux /proc/stat) and of this process."""
  wall_s: float
  machine_busy_s: float | None
  own_s: float


def cpu_snapshot() -> CpuSnapshot:
  """A point to measure other processes' CPU use from (see `other_cpu_load`)."""
  busy = None
  try:
    with open("/proc/stat", encoding="utf-8") as f:
      ticks = [int(x) for x in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    busy = (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    pass
  t = os.times()
  return CpuSnapshot(time.perf_counter(), busy, t.user + t.system)


def other_cpu_load(before: CpuSnapshot, after: CpuSnapshot) -> float | None:
  """Cores kept busy by *other* processes between two snapshots (None off Linux).

  Timings taken while this is well above 0 on a machine with few cores are
  inflated by contention, not by the code measured.
  """
  if before.machine_busy_s is None or after.machine_busy_s is None:
    return None
  wall = after.wall_s - before.wall_s
  if wall <= 0:
    return None
  other = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
  return max(0.0, other / wall)


def memory_stats(compiled) -> dict[str, int | None]:
  """Bytes from `compiled.memory_analysis()`: temp, argument, output, peak (if known)."""
  try:
    stats = compiled.memory_analysis()
  except Exception:  # some backends do not implement it  # pylint: disable=broad-except
    stats = None
  if stats is None:
    return {"temp_bytes": None, "argument_bytes": None, "output_bytes": None,
            "peak_bytes": None}
  peak = getattr(stats, "peak_memory_in_bytes", None)
  return {"temp_bytes": int(stats.temp_size_in_bytes),
          "argument_bytes": int(stats.argument_size_in_bytes),
          "output_bytes": int(stats.output_size_in_bytes),
          "peak_bytes": int(peak) if peak else None}


def peak_device_memory(device=None) -> int | None:
  """`peak_bytes_in_use` of the device's allocator (GPU/TPU), None where untracked (CPU).

  It is the high-water mark since the process started, not per program.
  """
  device = device or jax.devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  if not stats:
    return None
  peak = stats.get("peak_bytes_in_use")
  return int(peak) if peak is not None else None


def _f32(x):
  return jnp.asarray(x).astype(jnp.float32)


def naive_scores(score: str, query, keys, params: Mapping[str, Any] | None = None):
  """Reference scores in float32 by explicit einsums (independent of `scores.py`):
  the `naive` form of `score`'s registry entry, given the `params` its pure
  function takes (`function_params`, `function_options`).

  query `[..., Tq, dq]`, keys `[..., Tk, dk]` -> `[..., Tq, Tk]` float32.

  Raises:
    ValueError: naming `score` if it is unknown or its entry has no `naive`
      form (a kernel of such a score cannot be verified, so it is not timed).
  """
  spec = registry.get(score)
  if spec.naive is None:
    with_naive = tuple(n for n, s in registry.SCORES.items() if s.naive is not None)
    raise ValueError(f"`score` {score!r} has no naive form (its registry entry's `naive`); "
                     f"scores with one: {with_naive}.")
  params = dict(params or {})
  taken = spec.function_params + spec.function_options
  return _f32(spec.naive(query, keys, **{p: params[p] for p in taken if p in params}))


def naive_comparison(query, keys, params: Mapping[str, Any] | None = None
                     ) -> list[dict[str, Any]]:
  """The library's scores against their naive references, one row per
  registered score, in the registry's order.

  A score with a pure function and a `naive` form gets `status` 'ok' with
  `max_abs_err` (max |library − naive|, float32 scores) and `max_abs_ref`;
  the others are reported with the reason they cannot be compared ('no pure
  function', 'no naive form', 'params missing: ...'), so a score the
  benchmark cannot check is listed as such instead of missing. `params`: the weights of every
  parametrised score, by name (each score takes those its function names).
  """
  params = dict(params or {})
  rows = []
  for name, spec in registry.SCORES.items():
    missing = [p for p in spec.function_params if p not in params]
    if spec.function is None:
      rows.append({"score": name, "status": "no pure function"})
    elif spec.naive is None:
      rows.append({"score": name, "status": "no naive form"})
    elif missing:
      rows.append({"score": name, "status": f"params missing: {', '.join(missing)}"})
    else:
      library = compute_scores(name, query, keys, params)
      err, scale = max_error(_f32(library), naive_scores(name, query, keys, params))
      rows.append({"score": name, "status": "ok", "max_abs_err": err, "max_abs_ref": scale})
  return rows


def naive_attention(query, keys, values, mask=None, *, score: str = "scaled_dot",
                    params: Mapping[str, Any] | None = None):
  """The reference: float32 einsum scores, masked softmax, weighted sum.

  Returns context `[..., Tq, dv]` float32. A query row whose keys are all
  masked gets a zero context (the library's convention).
  """
  scores = naive_scores(score, query, keys, params)  # [..., Tq, Tk]
  if mask is not None:
    mask = jnp.asarray(mask)
    scores = jnp.where(mask, scores, -jnp.inf)
  row_max = jnp.max(scores, axis=-1, keepdims=True)
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  unnorm = jnp.exp(scores - row_max)  # [..., Tq, Tk]; exp(-inf) = 0 at masked keys
  total = jnp.sum(unnorm, axis=-1, keepdims=True)
  weights = unnorm / jnp.where(total > 0, total, 1.0)
  return jnp.einsum("...qk,...kd->...qd", weights, _f32(values),
                    precision=jax.lax.Precision.HIGHEST)  # [..., Tq, dv]


class KernelMismatchError(AssertionError):
  """A kernel's output differs from the reference by more than the tolerance."""


def max_error(candidate, reference) -> tuple[float, float]:
  """`(max |candidate - reference|, max |reference|)` over every leaf of two pytrees."""
  cand_leaves = jax.tree.leaves(candidate)
  ref_leaves = jax.tree.leaves(reference)
  if len(cand_leaves) != len(ref_leaves):
    raise ValueError(f"candidate has {len(cand_leaves)} arrays, reference "
                     f"{len(ref_leaves)}; they must have the same structure.")
  err, scale = 0.0, 0.0
  for c, r in zip(cand_leaves, ref_leaves):
    c, r = np.asarray(c, np.float64), np.asarray(r, np.float64)
    if c.shape != r.shape:
      raise KernelMismatchError(f"shape {c.shape} differs from the reference's {r.shape}.")
    if not np.all(np.isfinite(c)):
      return math.inf, float(np.max(np.abs(r))) if r.size else 0.0
    if c.size:
      err = max(err, float(np.max(np.abs(c - r))))
      scale = max(scale, float(np.max(np.abs(r))))
  return err, scale


def default_tolerance(dtype) -> float:
  """Allowed max error relative to the reference's largest magnitude, per input dtype.

  float32 allows for TF32 matmuls on GPUs (10-bit mantissa); half precision
  for bfloat16's 8-bit mantissa over long sums.
  """
  name = jnp.dtype(dtype).name
  return {"float64": 1e-6, "float32": 5e-3, "bfloat16": 5e-2, "float16": 2e-2}.get(name, 5e-2)


def verify_close(candidate, reference, *, rtol: float, name: str = "kernel") -> float:
  """Raises `KernelMismatchError` unless `max|c - r| <= rtol · max(1, max|r|)`.

  Returns the max absolute error.
  """
  err, scale = max_error(candidate, reference)
  bound = rtol * max(1.0, scale)
  if not err <= bound:
    raise KernelMismatchError(
        f"{name} disagrees with the naive reference: max |error| = {err:.3g} > "
        f"{bound:.3g} (rtol {rtol:g} × max(1, max|reference| = {scale:.3g})); "
        "refusing to time it.")
  return err


def machine_description() -> dict[str, Any]:
  """The machine this process runs on: platform, JAX's device kind, device
  count, CPU model, usable cores and JAX version (`provenance.machine`, from
  the process's one provenance record)."""
  return provenance.machine()
