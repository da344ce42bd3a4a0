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
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 2 << 30) -> bool:
  """Sets glibc malloc as the module docstring says; True if it took effect.

  Call it before JAX starts its CPU client (its threads would make arenas of
  their own). Elsewhere than glibc (macOS, musl) it does nothing and returns
  False.
  """
  if mmap_threshold <= 0 or trim_threshold <= 0:
    raise ValueError(f"`mmap_threshold` and `trim_threshold` must be positive byte counts, "
                     f"got {mmap_threshold} and {trim_threshold}.")
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
