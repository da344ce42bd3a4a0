"""How long a compiled call keeps the device busy, read from JAX's profiler trace.

A host clock around one blocking call counts the call's dispatch and the
wait for its result too. On an H200 at T = 1024 it gave 555 µs for the
library's `scaled_dot` forward+backward and 552 µs for jax.nn's cuDNN call
(results/gpu_h200), whose compiled programs differ by seven transposes
moving 0.23 GB, about 50 µs at the H200's 4.8 TB/s: a difference the host
clock did not show.

`device_seconds` runs a call under `jax.profiler.trace`, each repeat inside
a host annotation of its own, and reads the trace (`jax.profiler.ProfileData`):
per repeat, the span from the first device event that starts inside the
repeat's annotation to the last one's end. The device events are those of
the trace's device planes (`/device:GPU:0`, `/device:TPU:0`: kernels on
their streams, or XLA's module and op lines). A CPU has no device plane:
its programs run on the host's XLA client threads, whose lines
(`tf_XLA...`) stand for the device, which the result names (`source`).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import tempfile
from typing import Any, Callable, Sequence

DEVICE_PLANE_PREFIX = "/device:"
HOST_CPU_PLANE = "/host:CPU"
# The host threads XLA:CPU runs a program's work on (jax 0.10.2: its PjRt
# client's and its Eigen pool's), which stand for the device on a CPU.
CPU_EXECUTOR_LINE_PREFIX = "tf_XLA"
ANNOTATION = "attention_jax.device_time"


@dataclasses.dataclass(frozen=True)
class DeviceTimes:
  """Per repeat, the seconds from the first device event's start to the last
  one's end (`spans_s`) and the seconds some device event was running
  (`busy_s`, overlapping events counted once); `source` says whose events
  ('device planes' or, on a CPU, 'host XLA threads')."""
  spans_s: tuple[float, ...]
  busy_s: tuple[float, ...]
  source: str


def _events(plane):
  for line in plane.lines:
    for event in line.events:
      yield line.name, event


def union_seconds(intervals: Sequence[tuple[float, float]]) -> float:
  """The length of the union of `(start, end)` intervals (ns in, seconds out)."""
  total, end_so_far = 0.0, None
  for start, end in sorted(intervals):
    if end_so_far is None or start > end_so_far:
      total += end - start
      end_so_far = end
    elif end > end_so_far:
      total += end - end_so_far
      end_so_far = end
  return total / 1e9


def read_times(planes, repeats: int) -> DeviceTimes:
  """`DeviceTimes` of `repeats` annotated repeats from a trace's planes
  (objects with `name` and `lines`, each line a `name` and `events` with
  `name`, `start_ns` and `duration_ns`, as `jax.profiler.ProfileData`
  gives). A ValueError where a repeat's annotation or its device events are
  missing: a trace that cannot say is not read as zero."""
  planes = list(planes)
  windows = {}
  for plane in planes:
    if plane.name != HOST_CPU_PLANE:
      continue
    for _, event in _events(plane):
      if event.name.startswith(ANNOTATION + ":"):
        index = int(event.name.rsplit(":", 1)[1])
        windows[index] = (event.start_ns, event.start_ns + event.duration_ns)
  if sorted(windows) != list(range(repeats)):
    raise ValueError(f"the trace has annotations of repeats {sorted(windows)}, not of all "
                     f"{repeats}: it cannot say how long each ran.")
  device = [e for p in planes if p.name.startswith(DEVICE_PLANE_PREFIX) for _, e in _events(p)
            if e.duration_ns > 0]
  source = "device planes"
  if not device:
    device = [e for p in planes if p.name == HOST_CPU_PLANE for line, e in _events(p)
              if line.startswith(CPU_EXECUTOR_LINE_PREFIX) and e.duration_ns > 0]
    source = "host XLA threads"
  spans, busy = [], []
  for index in range(repeats):
    start, end = windows[index]
    inside = [(e.start_ns, e.start_ns + e.duration_ns) for e in device
              if start <= e.start_ns < end]
    if not inside:
      raise ValueError(f"repeat {index} has no event on the {source} inside its annotation.")
    spans.append((max(b for _, b in inside) - min(a for a, _ in inside)) / 1e9)
    busy.append(union_seconds(inside))
  return DeviceTimes(tuple(spans), tuple(busy), source)


def device_seconds(call: Callable[[], Any], repeats: int, *, warmup: int = 1) -> DeviceTimes:
  """Runs `call` (one blocking call of a compiled program: it must wait for
  its result, e.g. with `jax.block_until_ready`) `warmup` times untraced,
  then `repeats` times under the profiler, and reads each repeat's device
  time (`read_times`). The trace goes to a temporary folder, removed after."""
  import jax  # pylint: disable=g-import-not-at-top
  if repeats < 1:
    raise ValueError(f"`repeats` must be >= 1, got {repeats}.")
  for _ in range(warmup):
    call()
  folder = tempfile.mkdtemp(prefix="device_time_")
  try:
    with jax.profiler.trace(folder):
      for index in range(repeats):
        with jax.profiler.TraceAnnotation(f"{ANNOTATION}:{index}"):
          call()
    found = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if len(found) != 1:
      raise ValueError(f"the profiler wrote {len(found)} traces under {folder}, not one.")
    profile = jax.profiler.ProfileData.from_file(found[0])
    return read_times(profile.planes, repeats)
  finally:
    shutil.rmtree(folder, ignore_errors=True)
