"""Freed host memory kept by the process, so a step does not fault its buffers in again.

XLA:CPU packs a program's temporaries into one buffer, allocated with
`malloc` at every execution and freed at its end. glibc serves a block above
32 MiB (its largest automatic mmap threshold) by `mmap` and unmaps it when it
is freed, so every step faults its temporaries in afresh. The quick RNN's
training step has 108.4 MiB of temporaries (`memory_analysis`) and takes
27,750 minor page faults per step (`getrusage`): the same 108.4 MiB, 4 KiB at
a time; measured on one core of the project's 2-core Xeon, jax 0.10.2.

`keep_freed_memory` sets glibc's allocator (`mallopt`) to one arena, serves
allocations below `mmap_threshold` from it and returns memory to the system
only above `trim_threshold` of free space at the top. Set as a driver sets
it (after its imports), the faults per step drop to 1,916 and the step from
148 to 122 ms (median of 12 steps; results/cpu_efficiency/round2/micro.py
and micro.log, commit c8b4b72). The numbers computed are unchanged: only
where the buffers come from changes.
The price is resident memory: a process keeps its peak.

Only where JAX will run on the CPU alone. One arena makes every thread of the
process take the same lock to allocate, and XLA compiles for a GPU on many
threads: on an H200 with 16 host cores the sweep driver, so set, compiled its
training step in 91 and 116 s and its model-building program in 8.1 s, where
the calibration, a process without it on the same machine minutes before,
compiled the same recipe's step (21 members, not 12) in 16 to 19 s and
its build in 1.0 s (results/gpu_h200/2026-11-28b, fd33eca). The arena is the
setting known to differ between those two processes; a GPU run without it
has not been timed yet. `cpu_only` says which, before JAX starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil

# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def accelerator_plugins() -> list[str]:
  """The accelerator back ends JAX would find in this environment, found
  without importing or starting any: PJRT plugins (modules of the
  `jax_plugins` namespace package, and entry points of that group: how the
  CUDA and ROCm plugins are installed) and `libtpu` (TPU)."""
  found = []
  spec = importlib.util.find_spec("jax_plugins")
  if spec is not None and spec.submodule_search_locations:
    found += [f"jax_plugins.{m.name}" for m in
              pkgutil.iter_modules(list(spec.submodule_search_locations))]
  found += [e.value for e in importlib.metadata.entry_points(group="jax_plugins")]
  if importlib.util.find_spec("libtpu") is not None:
    found.append("libtpu")
  return sorted(set(found))


def requested_platforms(environ: dict | None = None) -> list[str]:
  """The platforms `JAX_PLATFORMS` of `environ` (default this process's)
  names, in order; empty where it is unset (JAX then picks its own)."""
  environ = os.environ if environ is None else environ
  return [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]


def cpu_only(environ: dict | None = None) -> bool:
  """Whether JAX in this process will run on the CPU alone: `JAX_PLATFORMS`
  where set (every platform it names `cpu`), else no accelerator back end
  installed (`accelerator_plugins`). Asked before JAX starts a backend."""
  platforms = requested_platforms(environ)
  if platforms:
    return all(p == "cpu" for p in platforms)
  return not accelerator_plugins()


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 2 << 30,
                      environ: dict | None = None) -> bool:
  """Sets glibc malloc as the module docstring says, where JAX will run on the
  CPU alone (`cpu_only` of `environ`, default this process's); True if it
  took effect. Next to an accelerator it does nothing and returns False.

  Call it before JAX starts its CPU client (its threads would make arenas of
  their own). Elsewhere than glibc (macOS, musl) it does nothing and returns
  False.
  """
  if mmap_threshold <= 0 or trim_threshold <= 0:
    raise ValueError(f"`mmap_threshold` and `trim_threshold` must be positive byte counts, "
                     f"got {mmap_threshold} and {trim_threshold}.")
  if not cpu_only(environ):
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  # mallopt takes an int: thresholds are capped below 2 GiB.
  cap = lambda n: min(n, (1 << 31) - 1)
  return all(mallopt(param, value) == 1 for param, value in (
      (M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, cap(mmap_threshold)),
      (M_TRIM_THRESHOLD, cap(trim_threshold))))
