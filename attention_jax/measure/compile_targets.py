"""Accelerators to compile for on a CPU-only host, and the time a program is predicted to take.

A `Target` describes a device by the numbers its prediction uses (peak FLOP/s,
memory bandwidth, device memory) and by how XLA compiles for it without one:
a TPU from libtpu's topologies, the H100 from `h100_target_config()`, the
device numbers XLA:GPU would otherwise query from the card.

The time of a program is the roofline `max(FLOPs / peak, bytes / bandwidth)`
plus a fixed cost per launched kernel and per loop iteration (`Target`), which
the RNN's sequential steps are made of. These overheads are assumptions, not
measurements: the first timed step on the device replaces them. The FLOPs
and bytes come from `attention_jax.measure.hlo.loop_aware_cost`, which counts
every loop body as many times as it runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Target:
  """An accelerator to compile for, and the numbers its prediction uses.

  `peak_flops`: dense bfloat16 FLOP/s; `bandwidth`: HBM bytes/s;
  `memory_bytes`: the device memory a program must fit in;
  `kernel_overhead_s`: time added per launched kernel (GPU) or per top-level
  op (TPU); `iteration_overhead_s`: per loop iteration (on the GPU, XLA
  copies the loop condition to the host every iteration).
  """
  name: str
  platform: str  # 'cuda' or 'tpu'
  description: str
  memory_bytes: int
  peak_flops: float
  bandwidth: float
  kernel_overhead_s: float
  iteration_overhead_s: float
  topology: str = ""  # libtpu topology name (TPU)
  # Several devices: how many, over how many hosts (processes), and what
  # libtpu needs to describe them as they are sold (chips per host, the two
  # TensorCores of a v4 chip as one device).
  devices: int = 1
  hosts: int = 1
  chips_per_host_bounds: tuple[int, ...] = ()
  chip_config_name: str = ""
  # Collectives (assumed, see `collective_seconds`): bytes/s each device
  # sends and receives in a ring all-reduce, and a fixed cost per collective.
  link_bandwidth: float = 0.0
  collective_overhead_s: float = 0.0


# Sources: NVIDIA H100 SXM5 data sheet (989 TFLOP/s dense bf16, 3.35 TB/s,
# 80 GB HBM3; the same peak as attention_jax.measure.benchmarking.PEAK_TFLOPS); Google
# Cloud TPU system-architecture pages (v5e: 197 TFLOP/s, 819 GB/s, 16 GiB;
# v6e: 918 TFLOP/s, 1640 GB/s, 32 GiB; v5p: 459 TFLOP/s, 2765 GB/s, 95 GiB).
# Overheads (assumed, see the module docstring): a CUDA kernel launch costs a
# few microseconds and XLA:GPU's while loop a device-to-host copy of its
# predicate per iteration; a TPU runs a whole program on the device, so a
# smaller per-op and per-iteration cost is taken.
TARGETS: dict[str, Target] = {
    "h100": Target("h100", "cuda", "NVIDIA H100 80GB HBM3 (SXM)", memory_bytes=80 * 10 ** 9,
                   peak_flops=989e12, bandwidth=3.35e12, kernel_overhead_s=3e-6,
                   iteration_overhead_s=10e-6),
    "tpu_v5e": Target("tpu_v5e", "tpu", "TPU v5e (one chip of v5e:2x2)", memory_bytes=16 * GiB,
                      peak_flops=197e12, bandwidth=819e9, kernel_overhead_s=0.5e-6,
                      iteration_overhead_s=1e-6, topology="v5e:2x2"),
    "tpu_v6e": Target("tpu_v6e", "tpu", "TPU v6e (one chip of v6e:2x2)", memory_bytes=32 * GiB,
                      peak_flops=918e12, bandwidth=1640e9, kernel_overhead_s=0.5e-6,
                      iteration_overhead_s=1e-6, topology="v6e:2x2"),
    "tpu_v5p": Target("tpu_v5p", "tpu", "TPU v5p (one chip of v5p:2x2x1)",
                      memory_bytes=95 * GiB, peak_flops=459e12, bandwidth=2765e9,
                      kernel_overhead_s=0.5e-6, iteration_overhead_s=1e-6,
                      topology="v5p:2x2x1"),
    # Several devices. Link bandwidths: NVLink 4 moves 900 GB/s per H100,
    # both directions together (450 GB/s each way); a TPU pod's all-reduce
    # bandwidth per chip is Google's per-pod figure over its chips (v5e:
    # 51.2 TB/s over 256 chips; v4: 1.1 PB/s over 4,096). v4: 275 TFLOP/s
    # bf16, 1,200 GB/s, 32 GiB per chip, its two TensorCores one device
    # ('megacore'); a v4-32 is 16 chips on 4 hosts, a v5e-8 8 chips on one.
    "h100x8": Target("h100x8", "cuda", "8 NVIDIA H100 80GB HBM3 (SXM), NVLink, one host",
                     memory_bytes=80 * 10 ** 9, peak_flops=989e12, bandwidth=3.35e12,
                     kernel_overhead_s=3e-6, iteration_overhead_s=10e-6, topology="1x1x8",
                     devices=8, link_bandwidth=450e9, collective_overhead_s=10e-6),
    "tpu_v5e_8": Target("tpu_v5e_8", "tpu", "TPU v5e-8 (v5e:2x4, 8 chips, one host)",
                        memory_bytes=16 * GiB, peak_flops=197e12, bandwidth=819e9,
                        kernel_overhead_s=0.5e-6, iteration_overhead_s=1e-6,
                        topology="v5e:2x4", devices=8, chips_per_host_bounds=(2, 4, 1),
                        link_bandwidth=200e9, collective_overhead_s=5e-6),
    "tpu_v4_32": Target("tpu_v4_32", "tpu", "TPU v4-32 (v4:2x2x4, 16 chips over 4 hosts)",
                        memory_bytes=32 * GiB, peak_flops=275e12, bandwidth=1200e9,
                        kernel_overhead_s=0.5e-6, iteration_overhead_s=1e-6,
                        topology="v4:2x2x4", devices=16, hosts=4,
                        chips_per_host_bounds=(2, 2, 1), chip_config_name="megacore",
                        link_bandwidth=268e9, collective_overhead_s=5e-6),
}

# The XLA target description of an H100 SXM: what XLA:GPU would query from
# the device (CUDA's device properties; cuDNN and CUDA versions of the
# runtime). Numbers from the CUDA device query of an H100 80GB HBM3: 132
# SMs, 1.98 GHz boost clock, 50 MiB L2, 228 KiB shared memory per SM.
H100_DEVICE_INFO = {
    "threads_per_block_limit": 1024, "threads_per_warp": 32,
    "shared_memory_per_block": 49152, "shared_memory_per_core": 233472,
    "threads_per_core_limit": 2048, "core_count": 132, "fpus_per_core": 128,
    "block_dim_limit_x": 2147483647, "block_dim_limit_y": 65535, "block_dim_limit_z": 65535,
    "memory_bandwidth": 3352320000000, "l2_cache_size": 52428800, "clock_rate_ghz": 1.98,
    "device_memory_size": 84929347584, "shared_memory_per_block_optin": 232448,
    "registers_per_core_limit": 65536, "registers_per_block_limit": 65536,
}


def h100_target_config(cudnn_version: tuple[int, int] = (9, 12),
                       cuda_version: tuple[int, int] = (13, 0)) -> str:
  """The `GpuTargetConfigProto` text of an H100 (compute capability 9.0) with
  the given cuDNN and CUDA runtime versions."""
  fields = "\n".join(f"  {k}: {v}" for k, v in H100_DEVICE_INFO.items())
  return (f"gpu_device_info {{\n{fields}\n  cuda_compute_capability {{ major: 9 minor: 0 }}\n}}\n"
          f"runtime_version {{ major: {cuda_version[0]} minor: {cuda_version[1]} }}\n"
          f'platform_name: "CUDA"\n'
          f"dnn_version_info {{ major: {cudnn_version[0]} minor: {cudnn_version[1]} }}\n"
          f'device_description_str: "NVIDIA H100 80GB HBM3"\n')



def roofline_seconds(flops: float, bytes_accessed: float, peak_flops: float,
                     bandwidth: float) -> float:
  """`max(flops / peak_flops, bytes_accessed / bandwidth)`: the time a program
  needs at the device's peak compute or memory rate, whichever binds."""
  for name, value in (("flops", flops), ("bytes_accessed", bytes_accessed)):
    if not (value >= 0 and math.isfinite(value)):
      raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
  for name, value in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
    if not (value > 0 and math.isfinite(value)):
      raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")
  return max(flops / peak_flops, bytes_accessed / bandwidth)


def predict_seconds(cost: Mapping[str, float], target: Target) -> float:
  """Roofline of `cost` (flops, bytes accessed) plus the target's overhead per
  kernel and per loop iteration (`cost['kernels']`, `cost['iterations']`)."""
  return (roofline_seconds(cost["flops"], cost["bytes accessed"], target.peak_flops,
                           target.bandwidth)
          + cost.get("kernels", 0) * target.kernel_overhead_s
          + cost.get("iterations", 0) * target.iteration_overhead_s)


# How much of a collective's buffer each device sends, as a multiple of
# (group - 1) / group of the buffer: a ring all-reduce passes it twice
# (reduce-scatter, then all-gather), the others once.
_RING_PASSES = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0,
                "all-to-all": 1.0}


def collective_seconds(collectives, target: Target) -> float:
  """Time of a step's collectives on `target`, none overlapped with compute
  (an upper bound where XLA runs them asynchronously): per collective its
  fixed cost plus its ring traffic over the link bandwidth, `passes x (g - 1)
  / g x bytes` for a group of g devices (a collective-permute sends its
  buffer once). `collectives`: rows of `hlo.collectives` (kind, group
  size, executions per step `count`, `bytes` summed over them)."""
  total = 0.0
  for c in collectives:
    group = c["group_size"]
    if group <= 1:
      continue
    if target.link_bandwidth <= 0:
      raise ValueError(f"target {target.name} has no `link_bandwidth` for its collectives.")
    share = _RING_PASSES.get(c["kind"], 1.0) * (group - 1) / group
    if c["kind"] == "collective-permute":
      share = 1.0
    total += (c["count"] * target.collective_overhead_s
              + share * c["bytes"] / target.link_bandwidth)
  return total


def total_bytes(memory: Mapping[str, int]) -> int:
  """What a compiled program holds at its peak: arguments + outputs +
  temporaries, less the outputs written into donated arguments (alias)."""
  return (memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"]
          - memory["alias_bytes"])


def fits(memory: Mapping[str, int], device_bytes: int, headroom: float = 0.9) -> bool:
  """Whether `total_bytes(memory)` is within `headroom` of the device memory
  (the runtime and its allocator keep the rest)."""
  return total_bytes(memory) <= headroom * device_bytes

