"""The kernels suite: attention forward / forward+backward per implementation.

For every sweep point (`Case`: mode × dtype × D × H × B × causal × T) each
implementation of `settings.impls` is built, compiled, and checked against a
naive float32 einsum reference of its score; only the kernels that agree are
timed, interleaved (`timing.time_ready`). One row per (case, impl) goes to
`write`, with status ok, refused (disagrees with the reference) or skipped
(does not apply, compile or fit).

Glossary: B batch, H heads, T sequence length (Tq = Tk), D head size.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import registry
from attention_jax.measure import benchmarking as bm
from experiments.kernels import kernel_impls
from experiments.kernels import resume
from experiments.kernels import timing
from experiments.kernels.kernel_impls import Case, Kernel
from experiments.kernels.settings import Settings


def cases(settings: Settings) -> Iterator[Case]:
  """The sweep, T varying fastest (so a plot's points are measured together)."""
  for mode, dtype, d, h, b, causal, t in itertools.product(
      settings.modes, settings.dtypes, settings.head_dims, settings.heads, settings.batch,
      settings.causal, sorted(settings.seq_lens)):
    yield Case(mode=mode, dtype=dtype, batch=b, heads=h, seq_len=t, head_dim=d, causal=causal)


def _outputs_of(kernel: Kernel, case: Case, inputs, run: Callable) -> tuple[Any, float]:
  """`(outputs in [B, H, T, D] layout, seconds)` of one call of `run` (layout inputs)."""
  args = tuple(kernel_impls.to_layout(x, kernel.layout) for x in inputs)
  start = time.perf_counter()
  outputs = jax.block_until_ready(run(*args))
  seconds = time.perf_counter() - start
  if kernel.layout == "bthd":
    outputs = jax.tree.map(lambda x: jnp.swapaxes(x, 1, 2), outputs)
  return outputs, seconds


def prepare_kernel(impl: str, kernel: Kernel, case: Case, inputs, reference,
                   limit_bytes: int) -> tuple[dict[str, Any], Callable[[], Any] | None, float]:
  """Compiles `kernel` and checks it against `reference`.

  Returns `(fields, call, first_call_s)`: `call()` runs one blocking call, and
  is None when the kernel must not be timed (fields then carry status and
  reason: 'refused' for a kernel that disagrees with the reference, 'skipped'
  for one that does not compile or does not fit). `reference=None` means the
  kernel was verified beforehand on a smaller case (`verify_kernel`).
  """
  fields: dict[str, Any] = {}
  if kernel.torch:
    run, as_numpy = kernel_impls.torch_runner(case, *inputs)
    start = time.perf_counter()
    outputs = as_numpy(run())
    first = time.perf_counter() - start
    fields.update(temp_bytes=None, argument_bytes=None, output_bytes=None, peak_bytes=None)
    call = run
  else:
    args = tuple(kernel_impls.to_layout(x, kernel.layout) for x in inputs)
    try:
      compiled, fields["compile_s"] = bm.compile_fn(kernel_impls.program(kernel, case.mode),
                                                    *args)
    except Exception as e:  # pylint: disable=broad-except
      return ({"status": "skipped", "reason": f"does not compile: {type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:300]}"}, None, 0.0)
    fields.update(bm.memory_stats(compiled))
    size = timing.compiled_bytes(fields)
    if size > limit_bytes:
      return ({**fields, "status": "skipped",
               "reason": f"compiled memory {size / 2 ** 30:.2f} GiB exceeds "
                         f"the limit {limit_bytes / 2 ** 30:.2f} GiB"}, None, 0.0)
    outputs, first = _outputs_of(kernel, case, inputs, compiled)
    call = functools.partial(compiled, *args)
  if reference is not None:
    try:
      fields["max_abs_err"] = bm.verify_close(outputs, reference,
                                              rtol=bm.default_tolerance(case.dtype), name=impl)
    except bm.KernelMismatchError as e:
      return {**fields, "status": "refused", "reason": str(e)}, None, first
  return fields, call, first


def verify_kernel(impl: str, kernel: Kernel, case: Case, inputs, reference) -> float:
  """Max error of `kernel` against `reference` at `case`; raises KernelMismatchError."""
  if kernel.torch:
    run, as_numpy = kernel_impls.torch_runner(case, *inputs)
    outputs = as_numpy(run())
  else:
    outputs, _ = _outputs_of(kernel, case, inputs,
                             jax.jit(kernel_impls.program(kernel, case.mode)))
  return bm.verify_close(outputs, reference, rtol=bm.default_tolerance(case.dtype), name=impl)


def reference(score: str, case: Case, inputs, params, limit_bytes: int):
  """The float32 reference of `score`: `(at, at_inputs, outputs)` at `case` or, when
  it does not fit in memory, at one batch element and one head (the kernel is
  then verified there); a string saying why when there is none."""
  small = dataclasses.replace(case, batch=1, heads=1)
  failure = None
  for at, at_inputs in ((case, inputs), (small, tuple(x[:1, :1] for x in inputs))):
    ref = kernel_impls.program(kernel_impls.reference_kernel(score, params, at), at.mode)
    try:
      compiled, _ = bm.compile_fn(ref, *at_inputs)
      if timing.compiled_bytes(bm.memory_stats(compiled)) <= limit_bytes:
        return at, at_inputs, jax.tree.map(np.asarray, compiled(*at_inputs))
    except Exception as e:  # pylint: disable=broad-except
      # A GPU's compiler can fail where the program would not fit (XLA's
      # autotuner allocates the operands: at T = 16384 on an H200, 64 GiB):
      # the smaller case is tried all the same.
      failure = f"reference failed: {type(e).__name__}: {str(e)[:200]}"
  return failure or "the naive reference does not fit in memory even at B = H = 1"


def _checked(impl: str, case: Case, settings: Settings, inputs, params, references,
             limit: int) -> tuple[dict[str, Any], Callable[[], Any] | None, float]:
  """`prepare_kernel` for `impl` at `case` after every check that can refuse it:
  `(fields, call or None, first call seconds)`; without a call, fields say why."""
  # `--additive_max_len` caps the scores with a per-pair block (additive's
  # [B, H, T, T, a] tanh block, whose work grows fastest).
  pair_block = registry.get(kernel_impls.score_of(impl)).pair_block
  if pair_block and case.seq_len > settings.additive_max_len:
    return ({"status": "skipped",
             "reason": f"T > --additive_max_len={settings.additive_max_len}"}, None, 0.0)
  try:
    kernel = kernel_impls.build_kernel(impl, case, params, settings.library_implementation)
  except kernel_impls.Skip as e:
    return {"status": "skipped", "reason": str(e)}, None, 0.0
  score = kernel_impls.score_of(impl)
  if score not in references:
    references[score] = reference(score, case, inputs, params, limit)
  if isinstance(references[score], str):
    return ({"status": "skipped",
             "reason": references[score] + "; unverified kernels are not timed"}, None, 0.0)
  at, at_inputs, expected = references[score]
  if at == case:
    return prepare_kernel(impl, kernel, case, inputs, expected, limit)
  try:  # verify on one batch element and head, then time the full case
    small = kernel_impls.build_kernel(impl, at, params, settings.library_implementation)
    extra = {"max_abs_err": verify_kernel(impl, small, at, at_inputs, expected),
             "verified_at": "B=1, H=1"}
  except bm.KernelMismatchError as e:
    return {"status": "refused", "reason": f"at B = H = 1: {e}"}, None, 0.0
  except Exception as e:  # pylint: disable=broad-except
    return ({"status": "skipped", "reason": f"verification at B = H = 1 failed: "
                                            f"{type(e).__name__}: {str(e)[:200]}"}, None, 0.0)
  fields, call, first = prepare_kernel(impl, kernel, case, inputs, None, limit)
  return ({**fields, **extra} if call is not None else fields), call, first


def run(settings: Settings, write: Callable[[dict], None],
        progress: resume.Progress | None = None) -> None:
  """Per case: compile and verify every implementation not measured yet
  (`progress.pending`, `resume.Progress`), then time them interleaved.

  Interleaving (one call of each implementation per round, the order rotating)
  spreads any load from other processes over all of them alike, so their
  ratios stay fair on a shared machine.
  """
  progress = progress or resume.Progress((), {})
  limit = timing.memory_limit_bytes(settings.memory_limit_gb)
  device_kind = jax.devices()[0].device_kind
  for case in cases(settings):
    peak = settings.peak_tflops or bm.dense_peak_tflops(device_kind, case.dtype)
    base = {"suite": "kernels", **dataclasses.asdict(case), "flops": case.flops,
            "library_implementation": settings.library_implementation}
    impls = progress.pending(base, settings.impls)
    if not impls:
      continue
    inputs = kernel_impls.inputs(case, settings.seed)  # q, k, v, cot: [B, H, T, D]
    params = kernel_impls.score_params(case.head_dim, case.dtype, settings.seed)
    references = {}  # score -> (case, inputs, reference outputs) or why there is none
    ready = {}  # impl -> (row, call, first call seconds)
    for impl in impls:
      fields, call, first = _checked(impl, case, settings, inputs, params, references, limit)
      row = {**base, "impl": impl, **fields}
      if call is None:
        write(row)
      else:
        ready[impl] = (row, call, first)
    if not ready:
      continue
    timings, other_load, attempts = timing.time_ready(ready, settings, warmup=settings.warmup)
    device_peak = bm.peak_device_memory()
    for impl, (row, call, _) in ready.items():
      tflops = case.flops / timings[impl].median_s / 1e12
      device = ({} if not settings.device_timing or impl == "torch"
                else timing.device_timing_fields(call, timings[impl].repeats, case.flops))
      write({**row, "status": "ok", **timing.timing_fields(timings[impl]), "tflops": tflops,
             "pct_peak": None if not peak else 100 * tflops / peak, **device,
             "peak_device_bytes": None if impl == "torch" else device_peak,
             "other_load_cores": other_load, "attempts": attempts})
