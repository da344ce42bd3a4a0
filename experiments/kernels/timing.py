"""Timing and memory-limit helpers shared by the suites.

A suite prepares `ready = {impl: (row, call, first_call_s)}` (each `call()` one
blocking call of a compiled program, `first_call_s` the untimed first call),
then `time_ready` times them interleaved and says under which load.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping

from absl import logging

from attention_jax.measure import benchmarking as bm
from attention_jax.measure import device_time
from attention_jax.training import memory as memory_lib
from experiments.kernels.settings import Settings

Ready = Mapping[str, tuple[dict, Callable[[], Any], float]]


def memory_limit_bytes(memory_limit_gb: float | None) -> int:
  """Programs bigger than this are not run: the setting, else 90% of the
  accelerator's memory, else half the available RAM (`training.memory`'s
  readers, which the trainer's budgets use too)."""
  if memory_limit_gb is not None:
    return int(memory_limit_gb * 2 ** 30)
  device = memory_lib.accelerator_memory()
  if device is not None:
    return int(0.9 * device)
  return memory_lib.available_memory() // 2


def compiled_bytes(memory: Mapping[str, int | None]) -> int:
  """Temp + argument + output bytes of a `bm.memory_stats` dict (None counts 0)."""
  return sum(memory.get(k) or 0 for k in ("temp_bytes", "argument_bytes", "output_bytes"))


def repeats_for(first_call_s: float, repeats: int, budget_s: float) -> int:
  """At least 3 timed calls for a median; fewer than `repeats` when a call is slow."""
  if first_call_s <= 0:
    return repeats
  return max(3, min(repeats, int(budget_s / first_call_s)))


def timed_with_retries(calls: Mapping[str, Callable[[], Any]], settings: Settings, *,
                       warmup: int, repeats: int):
  """`bm.time_interleaved`, repeated while other processes load the CPUs.

  Returns `(timings, other_load, attempts)`: the attempt during which other
  processes kept the fewest cores busy (`bm.other_cpu_load`). With
  `settings.max_other_load` set, an attempt above it is retried after a pause,
  at most `settings.load_retries` times; the load of the attempt kept is
  recorded either way.
  """
  best = None
  attempts = 0
  for attempts in range(1, settings.load_retries + 2):
    before = bm.cpu_snapshot()
    timings = bm.time_interleaved(calls, warmup=warmup if attempts == 1 else 1,
                                  repeats=repeats)
    load = bm.other_cpu_load(before, bm.cpu_snapshot())
    if best is None or (load is not None and (best[1] is None or load < best[1])):
      best = (timings, load)
    if settings.max_other_load is None or load is None or load <= settings.max_other_load:
      break
    if attempts <= settings.load_retries:
      logging.info("other processes kept %.2f cores busy; retrying in %.0f s", load,
                   settings.load_retry_pause_s)
      time.sleep(settings.load_retry_pause_s)
  return best[0], best[1], attempts


def time_ready(ready: Ready, settings: Settings, *, warmup: int):
  """Times every prepared call interleaved, with as many repeats as the budget allows.

  Returns `(timings, other_load, attempts)` as `timed_with_retries`.
  """
  repeats = repeats_for(sum(first for _, _, first in ready.values()), settings.repeats,
                        settings.time_budget_s)
  return timed_with_retries({impl: call for impl, (_, call, _) in ready.items()}, settings,
                            warmup=warmup, repeats=repeats)


def device_timing_fields(call: Callable[[], Any], repeats: int, flops: float) -> dict[str, Any]:
  """The row fields of `call`'s device-side time (`device_time.device_seconds`,
  `repeats` traced calls, each waited for, after one untraced): the median span and busy time,
  the TFLOP/s of the median span, and whose events they are. Where the trace
  cannot be taken or read (no profiler library on the device, a trace
  without the repeats' events), `device_time_error` says why and the row
  keeps its host-clock timing."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    times = device_time.device_seconds(lambda: jax.block_until_ready(call()), repeats)
  except Exception as e:  # pylint: disable=broad-except
    return {"device_time_error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
  span = statistics.median(times.spans_s)
  return {"device_time_median_s": span, "device_busy_median_s": statistics.median(times.busy_s),
          "device_time_repeats": len(times.spans_s), "device_time_source": times.source,
          "device_tflops": flops / span / 1e12 if span > 0 else None}


def timing_fields(timing: bm.Timing) -> dict[str, Any]:
  """The row fields of one timing."""
  return {"time_median_s": timing.median_s, "time_min_s": timing.min_s,
          "time_max_s": timing.max_s, "time_iqr_s": timing.iqr_s, "repeats": timing.repeats}
