r"""Compile the project's programs for an H100 or a TPU on a CPU-only host.

    bash scripts/aot_env.sh    # once: .venv-aot (jax 0.11.2, libtpu, CUDA 13 plugin, cuDNN)
    .venv-aot/bin/python -m experiments.compile_check --target=h100 --out=results/compile_check
    .venv-aot/bin/python -m experiments.compile_check --target=tpu_v5e --out=results/compile_check
    .venv-aot/bin/python -m experiments.compile_check --target=h100 --programs=kernels \
        --kernel_seq_lens=512,4096 --out=/tmp/cc

No accelerator is needed: XLA compiles for a target it is only described.
TPUs come from libtpu's topologies (`jax.experimental.topologies`, e.g.
'v5e:2x2'; the program is compiled for one chip of it, as 'v5e:1x1' is
refused); the H100 from the jax CUDA plugin given a target description
(`h100_target_config()`: the device numbers XLA would otherwise query).

Programs (--programs, comma-separated):
  gpu_sweep         the `gpu` preset's training step at every arm and
                    dimension: the sweep trainer's own vmapped-seeds step
                    (`EnsembleTrainer`), bfloat16, at the widest training batch.
  transformer_base  a Transformer-base training step (d_model 512, 8 heads,
                    d_ff 2048, 6 + 6 layers, vocabulary 32k, 128 x 64 tokens).
  kernels           the kernel benchmark's headline: scaled_dot, bfloat16,
                    B = 4, H = 16, D = 128, T = --kernel_seq_lens, causal and
                    not, forward and forward+backward; the library's `auto`,
                    and on the H100 also jax.nn's cuDNN kernel (`is_causal`).
  additive          the additive score at a = 1024 (B = 32, d = 64, float32,
                    forward+backward): the library's chunked form vs XLA's
                    naive `[B, Tq, Tk, a]` one, T = --additive_seq_lens; with
                    --additive_impls=pallas,... also the Pallas kernels
                    (`attention(score='additive', implementation='pallas')`).

Per program a row: compiled or the error; argument / output / alias /
temporary bytes from XLA's memory analysis and whether they fit the target's
memory; FLOPs and bytes accessed; a predicted time; whether the cuDNN
flash-attention call is in the compiled program. Written to
`<out>/<target>.jsonl` (each row with the versions, the commit and the
command) and `<out>/<target>.md`.

How the time is predicted (`predict_seconds`): XLA's cost analysis counts a
loop body once, whatever its trip count (checked: a 10-step `lax.scan` of a
matmul reports the FLOPs of one step, on the TPU's own cost model too), and
the RNN is loops. So every loop body of the compiled program is analysed on
its own and multiplied by its trip count (`loop_aware_cost`). The time is
then the roofline `max(FLOPs / peak, bytes / bandwidth)` plus a fixed cost
per launched kernel and per loop iteration (`Target`), which the RNN's
sequential steps are made of. These overheads are assumptions, not
measurements: the first timed step on the device replaces them. The TPU's
own `optimal_seconds` (loops once) is reported beside it.

The model code picks its attention kernel from `jax.default_backend()`,
which is 'cpu' here; while a program is traced it is told the target's
platform (`_backend_as`), so the compiled program is the one the device
would run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib
import json
import math
import os
import re
import sys
import time
import types
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import app
from absl import flags
import numpy as np

FLAGS = flags.FLAGS
GiB = 2 ** 30


# ----------------------------------------------------------------------------
# Targets.


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


# Sources: NVIDIA H100 SXM5 data sheet (989 TFLOP/s dense bf16, 3.35 TB/s,
# 80 GB HBM3; the same peak as attention_jax.benchmarking.PEAK_TFLOPS); Google
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


# ----------------------------------------------------------------------------
# Flags.

PROGRAMS = ("gpu_sweep", "transformer_base", "kernels", "additive")
ADDITIVE_IMPLS = ("chunked", "naive", "pallas")
DEFAULT_KERNEL_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_ADDITIVE_SEQ_LENS = (256, 512, 1024, 2048, 4096)


def define_flags() -> None:
  """The command line's flags; defined only when this module is the program
  (other drivers define flags of the same names, e.g. `--out`, and tests
  import them side by side)."""
  flags.DEFINE_string("target", None, f"What to compile for: one of {', '.join(TARGETS)}.")
  flags.DEFINE_string("programs", ",".join(PROGRAMS),
                      f"Comma-separated programs from {', '.join(PROGRAMS)}.")
  flags.DEFINE_string("out", None, "Folder for <target>.jsonl and <target>.md.")
  flags.DEFINE_string("kernel_seq_lens", ",".join(map(str, DEFAULT_KERNEL_SEQ_LENS)),
                      "Kernel program: sequence lengths T.")
  flags.DEFINE_bool("report_only", False, "Rewrite <out>/<target>.md from its jsonl; compile "
                    "nothing.")
  flags.DEFINE_string("additive_seq_lens", ",".join(map(str, DEFAULT_ADDITIVE_SEQ_LENS)),
                      "Additive program: sequence lengths T.")
  flags.DEFINE_string("additive_impls", "chunked,naive",
                      f"Additive program: comma-separated forms from {', '.join(ADDITIVE_IMPLS)}.")


@dataclasses.dataclass(frozen=True)
class Options:
  """The validated command line."""
  target: Target
  programs: tuple[str, ...]
  out: str
  kernel_seq_lens: tuple[int, ...]
  additive_seq_lens: tuple[int, ...]
  additive_impls: tuple[str, ...] = ("chunked", "naive")


def _int_list(name: str, raw: str) -> tuple[int, ...]:
  items = [s.strip() for s in str(raw).split(",") if s.strip()]
  if not items:
    raise ValueError(f"`--{name}` is empty.")
  try:
    values = tuple(int(s) for s in items)
  except ValueError:
    raise ValueError(f"`--{name}` must be comma-separated integers, got {raw!r}.") from None
  if any(v < 1 for v in values):
    raise ValueError(f"`--{name}`: every value must be >= 1, got {raw!r}.")
  return values


def parse_options(target: str | None, programs: str, out: str | None,
                  kernel_seq_lens: str, additive_seq_lens: str,
                  additive_impls: str = "chunked,naive") -> Options:
  """The flags' values checked; a ValueError names the first bad flag."""
  if not target:
    raise ValueError(f"`--target` is required: one of {', '.join(TARGETS)}.")
  if target not in TARGETS:
    raise ValueError(f"`--target` must be one of {', '.join(TARGETS)}; got {target!r}.")
  chosen = tuple(p.strip() for p in str(programs).split(",") if p.strip())
  if not chosen:
    raise ValueError(f"`--programs` is empty; choose from {', '.join(PROGRAMS)}.")
  for p in chosen:
    if p not in PROGRAMS:
      raise ValueError(f"`--programs`: {p!r} is not one of {', '.join(PROGRAMS)}.")
  if not out:
    raise ValueError("`--out` is required: the folder for the table and the jsonl.")
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"`--out` {out} exists and is not a folder.")
  impls = tuple(dict.fromkeys(p.strip() for p in str(additive_impls).split(",") if p.strip()))
  if not impls or any(p not in ADDITIVE_IMPLS for p in impls):
    raise ValueError(f"`--additive_impls` must name forms from {', '.join(ADDITIVE_IMPLS)}; "
                     f"got {additive_impls!r}.")
  return Options(TARGETS[target], tuple(dict.fromkeys(chosen)), out,
                 _int_list("kernel_seq_lens", kernel_seq_lens),
                 _int_list("additive_seq_lens", additive_seq_lens), impls)


# ----------------------------------------------------------------------------
# Prediction (pure).


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


def total_bytes(memory: Mapping[str, int]) -> int:
  """What a compiled program holds at its peak: arguments + outputs +
  temporaries, less the outputs written into donated arguments (alias)."""
  return (memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"]
          - memory["alias_bytes"])


def fits(memory: Mapping[str, int], device_bytes: int, headroom: float = 0.9) -> bool:
  """Whether `total_bytes(memory)` is within `headroom` of the device memory
  (the runtime and its allocator keep the rest)."""
  return total_bytes(memory) <= headroom * device_bytes


CUDNN_ATTENTION_CALL = "__cudnn$fmha"


def fused_attention_kernel(hlo_text: str) -> str | None:
  """'cudnn' when the compiled program calls cuDNN's flash attention, else None."""
  return "cudnn" if CUDNN_ATTENTION_CALL in hlo_text else None


# ----------------------------------------------------------------------------
# Loops in compiled HLO (pure text parsing; the cost analysis is passed in).

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?[\s)]([a-z][a-z0-9\-]*)\(")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CALLEE = {"while": re.compile(r"\bbody=%?([\w.\-]+)"),
           "call": re.compile(r"\bto_apply=%?([\w.\-]+)"),
           "conditional": re.compile(r"\bbranch_computations=\{([^}]*)\}")}
# Instructions that launch no work of their own.
_FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                       "while", "call", "conditional", "after-all", "partition-id",
                       "replica-id", "opt-barrier", "add-dependency"})


@dataclasses.dataclass
class Computation:
  name: str
  lines: list[str]
  kernels: int = 0  # instructions that launch work
  callees: list[tuple[str, int | None]] = dataclasses.field(default_factory=list)
  whiles: list[tuple[str, int | None]] = dataclasses.field(default_factory=list)
  custom_calls: list[str] = dataclasses.field(default_factory=list)  # their lines


_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def shapes_bytes(text: str) -> int:
  """Bytes of every array shape written in `text` (e.g. 'bf16[4,512]' -> 4096)."""
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    total += _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


# The `pl.CostEstimate` of a Pallas kernel in a TPU custom call's backend
# config. Pallas's Triton backend (GPU) does not pass it on (jax 0.11.2), so
# a Triton kernel stays uncosted.
_PALLAS_COST = re.compile(r'"cost_estimate":\s*\{"flops":\s*"?(\d+)"?,\s*"transcendentals":'
                          r'\s*"?\d+"?,\s*"bytes_accessed":\s*"?(\d+)"?')


def custom_call_cost(line: str) -> dict[str, float]:
  """FLOPs and bytes of a custom call, which XLA's cost analysis does not
  know (it counts each as -1). cuDNN attention: the FlashAttention count
  (`attention_jax.benchmarking.attention_flops`) from the call's
  `[B, H, Tq, Tk]` score shape and head size, halved when causal, x 2.5 for
  the backward; its bytes are its operands and results. A Pallas kernel on a
  TPU: its own `pl.CostEstimate`. Any other call: its results' bytes only,
  0 FLOPs (`known` False)."""
  target = re.search(r'custom_call_target="([^"]+)"', line)
  target = target.group(1) if target else ""
  result = line.split("=", 1)[1].split(" custom-call(")[0]
  operands = re.search(r"operand_layout_constraints=\{(.*?)\}, [a-z_]+=", line)
  own = _PALLAS_COST.search(line)
  if own:  # a Pallas kernel's pl.CostEstimate, which Mosaic (TPU) writes into the call
    return {"flops": float(own.group(1)), "bytes accessed": float(own.group(2)),
            "known": True}
  if not target.startswith(CUDNN_ATTENTION_CALL):
    return {"flops": 0.0, "bytes accessed": float(shapes_bytes(result)), "known": False}
  scores = re.search(r'"intermediate_tensor_shape":.*?"dimensions":\s*\[([^\]]*)\]', line)
  operand_shapes = _SHAPE.findall(operands.group(1)) if operands else []
  if not scores or not operand_shapes:
    return {"flops": 0.0, "bytes accessed": float(shapes_bytes(result)), "known": False}
  b, h, tq, tk = (int(x.strip().strip('"')) for x in scores.group(1).split(","))
  head = int(operand_shapes[0][1].split(",")[-1])
  flops = 4.0 * b * h * tq * tk * head
  if '"mask_type": "CAUSAL"' in line or '"mask_type":"CAUSAL"' in line:
    flops /= 2
  if "Backward" in target:
    flops *= 2.5
  return {"flops": flops, "known": True,
          "bytes accessed": float(shapes_bytes(result) + shapes_bytes(operands.group(1)))}


def parse_hlo(text: str) -> tuple[str, dict[str, Computation]]:
  """`(entry name, {name: Computation})` of an HLO module's text: each
  computation's launching instructions, the bodies of its while loops with
  their known trip counts (None if unknown) and its other callees."""
  comps: dict[str, Computation] = {}
  entry, current = None, None
  for line in text.splitlines():
    if current is None:
      m = _COMPUTATION.match(line)
      if m and not line.startswith("HloModule"):
        current = Computation(m.group(2), [line])
        if m.group(1):
          entry = current.name
      continue
    current.lines.append(line)
    if line.startswith("}"):
      comps[current.name] = current
      current = None
      continue
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    opcode = m.group(2)
    if opcode not in _FREE_OPS:
      current.kernels += 1
    if opcode == "while":
      body = _CALLEE["while"].search(line)
      trip = _TRIP.search(line)
      if body:
        condition = re.search(r"\bcondition=%?([\w.\-]+)", line)
        current.whiles.append((body.group(1), int(trip.group(1)) if trip else (
            condition.group(1) if condition else None)))
    elif opcode == "custom-call":
      current.custom_calls.append(line)
    elif opcode == "call":
      callee = _CALLEE["call"].search(line)
      if callee:
        current.callees.append((callee.group(1), 1))
    elif opcode == "conditional":
      branches = _CALLEE["conditional"].search(line)
      if branches:  # counted as if every branch ran (an upper bound)
        for name in branches.group(1).split(","):
          current.callees.append((name.strip().lstrip("%"), 1))
  if entry is None:
    raise ValueError("`hlo_text` has no ENTRY computation.")
  for comp in comps.values():  # a condition's name where XLA gave no trip count
    comp.whiles = [(body, trip if isinstance(trip, int) or trip is None
                    else counter_limit(comps[trip].lines) if trip in comps else None)
                   for body, trip in comp.whiles]
  return entry, comps


def counter_limit(condition_lines: Sequence[str]) -> int | None:
  """N when a loop condition is `counter < N` with N a constant: the trip
  count of a loop whose counter starts at 0 and steps by 1, as every
  `lax.scan` / `fori_loop` counter does (the TPU compiler's loops carry no
  `known_trip_count`, unlike XLA:GPU's). None for any other condition."""
  constants = {}
  for line in condition_lines:
    m = re.match(r"^\s*%?([\w.\-]+) = [su](?:8|16|32|64)\[\]\S* constant\((-?\d+)\)", line)
    if m:
      constants[m.group(1)] = int(m.group(2))
  for line in condition_lines:
    m = re.match(r"^\s*ROOT %?[\w.\-]+ = pred\[\]\S* compare\(%?([\w.\-]+), "
                 r"%?([\w.\-]+)\), direction=LT\b", line)
    if m and m.group(2) in constants and m.group(1) not in constants:
      return constants[m.group(2)]
  return None


def as_entry(hlo_text: str, name: str) -> str:
  """The module text with computation `name` as its ENTRY (so that a cost
  analysis of the module is the analysis of that computation alone)."""
  out, found = [], False
  for line in hlo_text.splitlines():
    if line.startswith("HloModule "):
      line = line.split(",")[0]  # drop the entry layout, which would not match
    elif line.startswith("ENTRY "):
      line = line[len("ENTRY "):]
    m = _COMPUTATION.match(line)
    if m and not line.startswith("HloModule") and m.group(2) == name:
      line, found = "ENTRY " + line, True
    out.append(line)
  if not found:
    raise ValueError(f"`name` {name!r} is not a computation of the module.")
  return "\n".join(out)


def loop_aware_cost(hlo_text: str, analyse: Callable[[str], Mapping[str, float]]) -> dict:
  """FLOPs, bytes accessed, launched kernels and loop iterations of one
  execution of the module, every loop body counted as many times as its
  known trip count.

  `analyse(module_text)` is a cost analysis that counts a loop body once
  (XLA's): a computation's true cost is its analysis, with each of its while
  bodies' analysis replaced by trip count x the body's true cost. A loop
  whose trip count XLA does not know is counted once and reported in
  `unknown_trip_loops`. (Trip counts: XLA's `known_trip_count`, else
  `counter_limit` of the loop's condition.)
  """
  entry, comps = parse_hlo(hlo_text)
  analysed: dict[str, Mapping[str, float]] = {}
  unknown = [0]
  unknown_calls: set[str] = set()

  def analysis(name):
    if name not in analysed:
      text = hlo_text if name == entry else as_entry(hlo_text, name)
      analysed[name] = analyse(text)
    return analysed[name]

  @functools.lru_cache(maxsize=None)
  def true_cost(name):
    comp = comps[name]
    base = analysis(name)
    cost = {"flops": float(base.get("flops", 0.0)),
            "bytes accessed": float(base.get("bytes accessed", 0.0)),
            "kernels": float(comp.kernels), "iterations": 0.0}
    for line in comp.custom_calls:  # XLA counts each as -1 FLOP and -1 byte
      extra = custom_call_cost(line)
      cost["flops"] += 1.0 + extra["flops"]
      cost["bytes accessed"] += 1.0 + extra["bytes accessed"]
      if not extra["known"]:
        unknown_calls.add(re.search(r'custom_call_target="([^"]+)"', line).group(1))
    for body, trip in comp.whiles:
      if trip is None:
        unknown[0] += 1
        trip = 1
      inner = true_cost(body)
      once = analysis(body)
      cost["flops"] += trip * inner["flops"] - float(once.get("flops", 0.0))
      cost["bytes accessed"] += (trip * inner["bytes accessed"]
                                 - float(once.get("bytes accessed", 0.0)))
      cost["kernels"] += trip * inner["kernels"]
      cost["iterations"] += trip * (1 + inner["iterations"])
    for callee, times in comp.callees:
      if callee in comps:  # their cost is in the analysis already; not their kernels
        inner = true_cost(callee)
        cost["kernels"] += times * inner["kernels"]
        cost["iterations"] += times * inner["iterations"]
    return cost

  result = dict(true_cost(entry))
  result["loops"] = sum(len(c.whiles) for c in comps.values())
  result["unknown_trip_loops"] = unknown[0]
  result["uncosted_custom_calls"] = sorted(unknown_calls)
  return result


# ----------------------------------------------------------------------------
# Table.


def _gb(n) -> str:
  return "–" if n is None else f"{n / 1e9:.2f}"


def _seconds(s) -> str:
  if s is None:
    return "–"
  if s < 0:  # libtpu's optimal_seconds of some loop programs
    return f"{s:.3g} s (negative)"
  if s >= 60:
    return f"{s / 60:.1f} min"
  if s >= 1:
    return f"{s:.2f} s"
  if s >= 1e-3:
    return f"{s * 1e3:.2f} ms"
  return f"{s * 1e6:.0f} µs"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """One line per row: program, case, status, memory (GB) and verdict, FLOPs,
  predicted time, the fused attention kernel if any."""
  head = ("| program | case | status | args GB | out GB | temp GB | total GB | fits | "
          "GFLOP | predicted | TPU optimal_s (loops once) | kernel |\n"
          "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
  lines = []
  for r in rows:
    ok = r.get("status") == "compiled"
    status = "compiled" if ok else f"error: {str(r.get('error', ''))[:80]}"
    verdict = "–" if r.get("fits") is None else ("yes" if r["fits"] else "**no**")
    flops = r.get("flops")
    lines.append(
        f"| {r['program']} | {r['case']} | {status} | {_gb(r.get('argument_bytes'))} | "
        f"{_gb(r.get('output_bytes'))} | {_gb(r.get('temp_bytes'))} | "
        f"{_gb(r.get('total_bytes'))} | {verdict} | "
        f"{'–' if flops is None else f'{flops / 1e9:,.1f}'} | "
        f"{_seconds(r.get('predicted_s'))} | {_seconds(r.get('target_optimal_seconds'))} | "
        f"{r.get('fused_attention') or '–'} |")
  return head + "\n".join(lines) + "\n"


def sweep_seconds(rows: Iterable[Mapping[str, Any]], program: str = "gpu_sweep",
                  key: str = "predicted_s") -> float | None:
  """Predicted training time of a whole sweep: Σ steps × the rows' `key`
  (`predicted_s`, or `roofline_s` for the bound without overheads) over the
  rows of `program` (None when one failed or none ran)."""
  chosen = [r for r in rows if r["program"] == program]
  if not chosen or any(r.get(key) is None or not r.get("steps") for r in chosen):
    return None
  return sum(r["steps"] * r[key] for r in chosen)


def _count(n) -> str:
  return "–" if n is None else f"{n:,}"


def _compiled(rows, program):
  return [r for r in rows if r["program"] == program and r.get("status") == "compiled"]


def sweep_table(rows: Sequence[Mapping[str, Any]], target: Target) -> str:
  """Per (arm, dim) of the sweep: memory, step time (FLOPs at peak alone, the
  roofline, and with overheads) and the time of its steps."""
  lines = ["| arm | total GB | fits | GFLOP / step | FLOPs at peak | roofline step | "
           "predicted step | kernels / step | loop iterations / step | steps | predicted time |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in _compiled(rows, "gpu_sweep"):
    flops = r.get("flops")
    lines.append(f"| {r['case']} | {_gb(r.get('total_bytes'))} | "
                 f"{'yes' if r.get('fits') else '**no**'} | "
                 f"{'–' if flops is None else f'{flops / 1e9:,.0f}'} | "
                 f"{'–' if flops is None else _seconds(flops / target.peak_flops)} | "
                 f"{_seconds(r.get('roofline_s'))} | "
                 f"{_seconds(r.get('predicted_s'))} | {_count(r.get('kernels'))} | "
                 f"{_count(r.get('loop_iterations'))} | {_count(r.get('steps'))} | "
                 f"{_seconds(r.get('predicted_total_s'))} |")
  return "\n".join(lines) + "\n"


def kernel_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Per kernel case: memory, predicted time and TFLOP/s by the benchmark's
  FLOP count (FlashAttention convention), and the fused kernel if any."""
  lines = ["| case | total GB | fits | predicted | TFLOP/s (benchmark count) | cuDNN |",
           "|---|---:|---|---:|---:|---|"]
  for r in rows:
    if r["program"] != "kernels":
      continue
    if r.get("status") != "compiled":
      lines.append(f"| {r['case']} | error: {str(r.get('error', ''))[:100]} | | | | |")
      continue
    tflops = r.get("predicted_tflops")
    lines.append(f"| {r['case']} | {_gb(r.get('total_bytes'))} | "
                 f"{'yes' if r.get('fits') else '**no**'} | {_seconds(r.get('predicted_s'))} | "
                 f"{'–' if tflops is None else f'{tflops:.0f}'} | "
                 f"{'yes' if r.get('fused_attention') == 'cudnn' else 'no'} |")
  return "\n".join(lines) + "\n"


def additive_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Temporary memory of the chunked and the naive additive score over T."""
  by_t: dict[int, dict[str, Mapping]] = {}
  for r in rows:
    if r["program"] == "additive":
      by_t.setdefault(r["shapes"]["seq_len"], {})[r["shapes"]["impl"]] = r

  def cell(r):
    if r is None:
      return "–"
    if r.get("status") != "compiled":
      return "error"
    return f"{_gb(r['temp_bytes'])}{'' if r.get('fits') else ' (does not fit)'}"

  if any("additive_pallas" in forms for forms in by_t.values()):
    return _additive_table_with_pallas(by_t, cell)
  lines = ["| T | chunked temp GB | naive temp GB | chunked predicted | naive predicted |",
           "|---:|---:|---:|---:|---:|"]
  for t in sorted(by_t):
    c, n = by_t[t].get("additive_chunked"), by_t[t].get("additive_naive")
    lines.append(f"| {t} | {cell(c)} | {cell(n)} | {_seconds((c or {}).get('predicted_s'))} | "
                 f"{_seconds((n or {}).get('predicted_s'))} |")
  return "\n".join(lines) + "\n"


def _additive_table_with_pallas(by_t, cell) -> str:
  """Temporaries, counted GFLOP and predicted time of the three forms over T."""
  forms = ("additive_pallas", "additive_chunked", "additive_naive")
  names = [f.split("_")[1] for f in forms]
  lines = ["| T | " + " | ".join(f"{n} temp GB" for n in names) + " | "
           + " | ".join(f"{n} GFLOP" for n in names) + " | "
           + " | ".join(f"{n} predicted" for n in names) + " |",
           "|---:|" + "---:|" * (3 * len(forms))]
  for t in sorted(by_t):
    rows = [by_t[t].get(f) or {} for f in forms]
    flops = [("–" if r.get("flops") is None else f"{r['flops'] / 1e9:,.0f}") for r in rows]
    lines.append(f"| {t} | " + " | ".join(cell(r or None) for r in rows) + " | "
                 + " | ".join(flops) + " | "
                 + " | ".join(_seconds(r.get("predicted_s")) for r in rows) + " |")
  return "\n".join(lines) + "\n"


def summary(rows: Sequence[Mapping[str, Any]], target: Target) -> str:
  """The markdown report: the target, the sweep prediction, a table per
  program and every row."""
  parts = [f"# Compile check: {target.description}\n",
           f"Device memory {target.memory_bytes / 1e9:.1f} GB (a program fits when arguments + "
           f"outputs + temporaries - aliased ≤ 90% of it); peak {target.peak_flops / 1e12:.0f} "
           f"TFLOP/s bf16, {target.bandwidth / 1e12:.2f} TB/s; overhead per kernel "
           f"{target.kernel_overhead_s * 1e6:g} µs and per loop iteration "
           f"{target.iteration_overhead_s * 1e6:g} µs (assumed).\n"]
  if rows:
    first = rows[0]
    parts.append(f"Compiled on a CPU-only host with {json.dumps(first.get('versions'))}, "
                 f"commit {first.get('commit')}, {first.get('date')}: "
                 f"`{first.get('command')}`.\n")
  sweep = sweep_seconds(rows)
  if sweep is not None:
    compute = sum(r["steps"] * r["flops"] / target.peak_flops
                  for r in rows if r["program"] == "gpu_sweep")
    parts.append(f"Predicted training time of the `gpu` sweep (every arm and dimension, "
                 f"training steps only, no evaluation or decoding): **{_seconds(sweep)}**; "
                 f"the roofline alone (no overheads) "
                 f"{_seconds(sweep_seconds(rows, key='roofline_s'))}, the FLOPs at peak alone "
                 f"{_seconds(compute)}.\n")
  for program, title, table in (
      ("gpu_sweep", "The `gpu` preset's training step (seeds vmapped, widest batch)",
       functools.partial(sweep_table, target=target)),
      ("kernels", "Kernel benchmark headline shapes", kernel_table),
      ("additive", "Additive score, a = 1024, forward+backward", additive_table)):
    if any(r["program"] == program for r in rows):
      parts.append(f"## {title}\n\n{table(rows)}")
  parts.append(f"## Every program\n\n{markdown_table(rows)}")
  return "\n".join(parts)


def report_only(out: str, target: Target) -> str:
  """Rewrites `<out>/<target>.md` from `<out>/<target>.jsonl`; returns it."""
  path = os.path.join(out, target.name + ".jsonl")
  if not os.path.exists(path):
    raise ValueError(f"`--out` {out} has no {target.name}.jsonl to report.")
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  _write(out, target, rows, jsonl=False)
  return summary(rows, target)


# ----------------------------------------------------------------------------
# Programs (need jax; imported when first used).


@dataclasses.dataclass
class Case:
  """One program to compile: `build()` gives `(jitted function, args)`, the
  args arrays or ShapeDtypeStructs (their values are never used)."""
  program: str
  case: str
  shapes: dict
  build: Callable[[], tuple[Callable, tuple]]
  steps: int | None = None  # steps of this program in the sweep
  attention_flops: float | None = None  # the benchmark's FLOP count of the case


class _ShapeOnlyData:
  """What `EnsembleTrainer` reads of a dataset to build its programs: the
  tokenizer's ids and size, and the longest sentence of each split."""

  def __init__(self, vocab_size: int, longest: int):
    from attention_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
    self.tokenizer = types.SimpleNamespace(
        vocab_size=vocab_size, pad_id=tokenizer.PAD_ID, eos_id=tokenizer.EOS_ID,
        sos_id=tokenizer.SOS_ID)
    self._lengths = types.SimpleNamespace(lengths=np.array([longest]))

  def token_ids(self, split: str):
    return self._lengths, self._lengths


def train_step_case(program: str, case: str, cfg, arm, steps: int | None) -> Case:
  """The sweep trainer's own compiled step (`EnsembleTrainer`, seeds vmapped,
  parameters and optimiser state donated) at the widest training batch."""

  def build():
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from attention_jax.data import batching  # pylint: disable=g-import-not-at-top
    from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top
    width = int(batching.padded_length(cfg.max_length + 1))
    trainer = train_lib.EnsembleTrainer(cfg.point(arm),
                                        _ShapeOnlyData(cfg.vocab_size, cfg.max_length),
                                        tuple(range(cfg.seeds)))
    ints = jax.ShapeDtypeStruct((cfg.batch_size, width), jnp.int32)
    args = (trainer.params, trainer.rest, trainer.opt_state,
            jax.ShapeDtypeStruct((), jnp.int32), ints, ints, ints)
    return trainer._train_step, args  # pylint: disable=protected-access

  from attention_jax.data import batching  # pylint: disable=g-import-not-at-top
  width = int(batching.padded_length(cfg.max_length + 1))
  shapes = dict(model=cfg.model, arm=arm.name, dim=arm.attention_dim, seeds=cfg.seeds,
                batch=cfg.batch_size, length=width, vocab=cfg.vocab_size, dtype=cfg.dtype)
  return Case(program, case, shapes, build, steps=steps)


def gpu_sweep_cases() -> list[Case]:
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.from_preset("gpu")
  return [train_step_case("gpu_sweep", arm.label, cfg, arm, cfg.steps) for arm in cfg.sweep()]


def transformer_base_cases() -> list[Case]:
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.ExperimentConfig(
      model="transformer", arms=("scaled_dot",), dims=(64,), seeds=1, vocab_size=32000,
      hidden_dim=512, num_heads=8, ff_dim=2048, encoder_layers=6, decoder_layers=6,
      dropout=0.1, label_smoothing=0.1, adam_b2=0.98, batch_size=128, max_length=63,
      dtype="bfloat16")
  return [train_step_case("transformer_base", "scaled_dot d_k=64", cfg, cfg.sweep()[0], None)]


KERNEL_SHAPE = dict(batch=4, heads=16, head_dim=128)


def kernel_cases(seq_lens: Sequence[int], platform: str) -> list[Case]:
  """scaled_dot bf16 at `seq_lens`, causal or not, forward or forward+backward:
  the library's `attention(implementation='auto')` (the benchmark's
  `scaled_dot`), and on CUDA jax.nn's cuDNN kernel (the benchmark's
  `jax_cudnn`). The library is given the causal mask as `causal=True`, as
  the benchmark and the Transformer give it, so that `auto` can take cuDNN's
  fused kernel for it."""
  from attention_jax import benchmarking as bm  # pylint: disable=g-import-not-at-top
  impls = ("auto", "jax_cudnn") if platform == "cuda" else ("auto",)
  b, h, d = KERNEL_SHAPE["batch"], KERNEL_SHAPE["heads"], KERNEL_SHAPE["head_dim"]
  cases = []
  for t in seq_lens:
    for causal in (False, True):
      for mode in ("fwd", "fwd_bwd"):
        for impl in impls:
          name = (f"{'scaled_dot auto' if impl == 'auto' else 'jax cudnn'} T={t}"
                  f"{' causal' if causal else ''} {mode}")
          shapes = dict(impl=impl, batch=b, heads=h, seq_len=t, head_dim=d, causal=causal,
                        mode=mode, dtype="bfloat16")
          cases.append(Case("kernels", name, shapes,
                            functools.partial(_kernel_program, impl, b, h, t, d, causal, mode),
                            attention_flops=bm.attention_flops(
                                b, h, t, t, d, causal=causal, backward=mode == "fwd_bwd")))
  return cases


def _kernel_program(impl, b, h, t, d, causal, mode):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import attention_jax as aj  # pylint: disable=g-import-not-at-top

  if impl == "auto":
    def kernel(q, k, v):  # [B, H, T, D]
      return aj.attention(q, k, v, score="scaled_dot", causal=causal, implementation="auto")
    shape = (b, h, t, d)
  else:
    kernel = functools.partial(jax.nn.dot_product_attention, is_causal=causal,
                               implementation="cudnn")
    shape = (b, t, h, d)  # its own layout, as the benchmark times it

  if mode == "fwd":
    fn = lambda q, k, v, cot: kernel(q, k, v)
  else:
    def loss(q, k, v, cot):
      return jnp.sum(kernel(q, k, v).astype(jnp.float32) * cot.astype(jnp.float32))
    fn = jax.grad(loss, argnums=(0, 1, 2))
  arg = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  return jax.jit(fn), (arg, arg, arg, arg)


ADDITIVE_SHAPE = dict(batch=32, attention_dim=1024, head_dim=64)


def additive_cases(seq_lens: Sequence[int],
                   impls: Sequence[str] = ("chunked", "naive"),
                   attention_dim: int | None = None) -> list[Case]:
  """Forward+backward of additive attention at a = 1024 (or `attention_dim`):
  the library's chunked `scores.additive`, XLA's naive `scores.additive_naive`
  and the Pallas kernels (`pallas_additive`), those of `impls`."""
  a = attention_dim or ADDITIVE_SHAPE["attention_dim"]
  cases = []
  for t in seq_lens:
    for impl in (f"additive_{name}" for name in impls):
      shapes = dict(impl=impl, seq_len=t, dtype="float32", **{**ADDITIVE_SHAPE,
                                                              "attention_dim": a})
      cases.append(Case("additive", f"{impl} T={t}", shapes,
                        functools.partial(_additive_program, impl, t, a)))
  return cases


def _additive_program(impl, t, a):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import attention_jax as aj  # pylint: disable=g-import-not-at-top
  from attention_jax import scores  # pylint: disable=g-import-not-at-top
  score = scores.additive if impl == "additive_chunked" else scores.additive_naive
  b, d = ADDITIVE_SHAPE["batch"], ADDITIVE_SHAPE["head_dim"]

  def loss(q, k, values, w_q, w_k, v_att, cot):
    if impl == "additive_pallas":
      context = aj.attention(q, k, values, score="additive", implementation="pallas",
                             params={"w_q": w_q, "w_k": w_k, "v": v_att})
    else:
      context, _ = aj.attend(score(q, k, w_q, w_k, v_att), values)  # [B, T, d]
    return jnp.sum(context * cot)

  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  args = (f32(b, t, d), f32(b, t, d), f32(b, t, d), f32(d, a), f32(d, a), f32(a), f32(b, t, d))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5))), args


def cases_for(options: Options) -> list[Case]:
  cases = []
  for program in options.programs:
    if program == "gpu_sweep":
      cases += gpu_sweep_cases()
    elif program == "transformer_base":
      cases += transformer_base_cases()
    elif program == "kernels":
      cases += kernel_cases(options.kernel_seq_lens, options.target.platform)
    else:
      cases += additive_cases(options.additive_seq_lens, options.additive_impls)
  return cases


# ----------------------------------------------------------------------------
# Compiling (needs the AOT environment: libtpu, the CUDA plugin).

# Set before jax is imported: compile for the described devices only, never
# look for a local one (the CUDA plugin's version checks need a driver).
ENVIRONMENT = {"JAX_PLATFORMS": "cpu", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
               "CUDA_VISIBLE_DEVICES": "-1", "TPU_SKIP_MDS_QUERY": "1"}


# Everything that shapes the compiled programs.
DISTRIBUTIONS = ("jax", "jaxlib", "libtpu", "jax-cuda13-plugin", "jax-cuda13-pjrt",
                 "nvidia-cudnn-cu13", "flax", "optax")


def versions() -> dict[str, str | None]:
  """Python's and the installed versions of `DISTRIBUTIONS` (None: not installed)."""
  # Imported here: the package imports jax, which must not start before ENVIRONMENT is set.
  from attention_jax.training import provenance as provenance_lib  # pylint: disable=g-import-not-at-top
  return provenance_lib.versions(DISTRIBUTIONS)


def git_commit() -> str | None:
  """HEAD of the checkout this file is in, '+dirty' when tracked files differ from it."""
  from attention_jax.training import provenance as provenance_lib  # pylint: disable=g-import-not-at-top
  head, dirty = provenance_lib.git_state(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if head is None:
    return None
  return head + ("+dirty" if dirty else "")


def _cudnn_version() -> tuple[int, int]:
  v = versions().get("nvidia-cudnn-cu13")
  if not v:
    return (9, 12)
  major, minor = v.split(".")[:2]
  return int(major), int(minor)


def target_device(target: Target):
  """One compile-only device of `target`."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if target.platform == "tpu":
    topo = topologies.get_topology_desc(topology_name=target.topology, platform="tpu")
  else:
    topo = topologies.get_topology_desc(
        target.name, "cuda", target_config=h100_target_config(_cudnn_version()),
        topology="1x1x1")
  return topo.devices[0]


@contextlib.contextmanager
def _backend_as(platform: str):
  """`jax.default_backend()` answers the target's platform ('gpu' for CUDA)
  while a program is traced, so that the model code picks the kernels it
  would pick on the device (attention.select_implementation asks it)."""
  import jax  # pylint: disable=g-import-not-at-top
  name = "gpu" if platform == "cuda" else platform
  original = jax.default_backend
  jax.default_backend = lambda: name
  try:
    yield
  finally:
    jax.default_backend = original


@contextlib.contextmanager
def _cudnn_probe_on(sharding):
  """`attention`'s cuDNN probe compiles for the device of `sharding` while a
  program is traced: compiled for this host's CPU, the probe fails and `auto`
  would take XLA's kernel where the device would take cuDNN's."""
  # The module, not the function `attention_jax.attention` it exports.
  attention = importlib.import_module("attention_jax.attention")
  original = attention.cudnn_probe_sharding
  attention.cudnn_probe_sharding = sharding
  try:
    yield
  finally:
    attention.cudnn_probe_sharding = original


def _abstract_mesh_of(sharding):
  """Lowering sees the target's device as its abstract mesh: Pallas's Triton
  backend reads the GPU it compiles for from there ('No supported GPU
  devices found' otherwise, on a host without one)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh)


def _device_sharding(device):
  """A sharding that places an array whole on `device`."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  return NamedSharding(Mesh(np.array([device]), ("device",)), PartitionSpec())


def _on_device(args, sharding):
  """Every array of `args` as a ShapeDtypeStruct placed by `sharding`."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)


def _params_jaxprs(params: Mapping[str, Any]):
  """The jaxprs among an equation's parameters (a ClosedJaxpr's inner one)."""
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      inner = getattr(item, "jaxpr", item)
      if hasattr(inner, "eqns"):
        yield inner


def pallas_cost_estimates(jaxpr) -> dict:
  """Σ of the `pl.CostEstimate`s of the Pallas calls in a program's jaxpr
  (each call site once: none of the compiled programs has one in a loop),
  with their number. Used where the compiled program does not carry them:
  Pallas's Triton backend drops the estimate (jax 0.11.2), so XLA and
  `loop_aware_cost` see its kernels as uncosted custom calls."""
  total = {"flops": 0.0, "bytes accessed": 0.0, "calls": 0}

  def walk(inner):
    for eqn in inner.eqns:
      if eqn.primitive.name == "pallas_call":
        estimate = eqn.params.get("cost_estimate")
        if estimate is not None:
          total["flops"] += estimate.flops
          total["bytes accessed"] += estimate.bytes_accessed
          total["calls"] += 1
        continue  # its own jaxpr is the kernel body
      for sub in _params_jaxprs(eqn.params):
        walk(sub)

  walk(getattr(jaxpr, "jaxpr", jaxpr))
  return total


TRITON_CALL = "__gpu$xla.gpu.triton"


def cpu_cost_analysis(module_text: str) -> dict:
  """XLA's HLO cost analysis of a module text, run by the CPU client (the
  CUDA plugin's compiled programs report none)."""
  import jaxlib._hlo as hlo  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  module = hlo.hlo_module_from_text(module_text)
  return _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), module)


def compile_case(case: Case, target: Target, device) -> dict:
  """Compiles `case` for `device`; the row of what XLA says about it."""
  row = {"program": case.program, "case": case.case, "shapes": case.shapes,
         "target": target.name, "device_kind": getattr(device, "device_kind", None),
         "device_memory_bytes": target.memory_bytes}
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  sharding = _device_sharding(device)
  try:
    with (_backend_as(target.platform), _cudnn_probe_on(sharding),
          _abstract_mesh_of(sharding)):
      fn, args = case.build()
      lowered = fn.lower(*_on_device(args, sharding))
      pallas = (pallas_cost_estimates(jax.make_jaxpr(fn)(*_on_device(args, sharding)))
                if target.platform == "cuda" else None)
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    row.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:400]}",
               compile_s=round(time.perf_counter() - start, 2))
    return row
  row.update(status="compiled", compile_s=round(time.perf_counter() - start, 2))
  mem = compiled.memory_analysis()
  memory = {"argument_bytes": int(mem.argument_size_in_bytes),
            "output_bytes": int(mem.output_size_in_bytes),
            "alias_bytes": int(mem.alias_size_in_bytes),
            "temp_bytes": int(mem.temp_size_in_bytes)}
  row.update(memory, total_bytes=total_bytes(memory), fits=fits(memory, target.memory_bytes))
  own = compiled.cost_analysis() or {}
  if isinstance(own, list):  # older jax: one dict per module
    own = own[0] if own else {}
  if own:
    row.update(target_flops=own.get("flops"), target_bytes_accessed=own.get("bytes accessed"),
               target_optimal_seconds=own.get("optimal_seconds"))
  text = compiled.as_text()
  row["fused_attention"] = fused_attention_kernel(text)
  try:
    modules = compiled.runtime_executable().hlo_modules()
    cost = loop_aware_cost(modules[0].to_string(), cpu_cost_analysis)
  except Exception as e:  # pylint: disable=broad-except
    row["cost_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return row
  if pallas and pallas["calls"] and TRITON_CALL in cost["uncosted_custom_calls"]:
    # The Triton kernels' own estimates, which the compiled program lacks.
    cost["flops"] += pallas["flops"]
    cost["bytes accessed"] += pallas["bytes accessed"]
    row["pallas_costed_from_jaxpr"] = pallas["calls"]
  row.update(flops=cost["flops"], bytes_accessed=cost["bytes accessed"],
             kernels=int(cost["kernels"]), loop_iterations=int(cost["iterations"]),
             loops=cost["loops"], unknown_trip_loops=cost["unknown_trip_loops"],
             uncosted_custom_calls=cost["uncosted_custom_calls"],
             roofline_s=roofline_seconds(cost["flops"], cost["bytes accessed"],
                                         target.peak_flops, target.bandwidth),
             predicted_s=predict_seconds(cost, target))
  if case.steps:
    row.update(steps=case.steps, predicted_total_s=case.steps * row["predicted_s"])
  if case.attention_flops:
    row["attention_flops"] = case.attention_flops
    row["predicted_tflops"] = case.attention_flops / row["predicted_s"] / 1e12
  return row


def run(options: Options, command: str, log: Callable[[str], None] = print) -> list[dict]:
  """Compiles every case of `options`; writes `<out>/<target>.jsonl` and `.md`
  (rewritten after each case, so a killed run keeps what it compiled)."""
  os.makedirs(options.out, exist_ok=True)
  target = options.target
  provenance = row_provenance(command)
  device = target_device(target)
  log(f"target {target.name}: {device.device_kind}; versions {provenance['versions']}")
  rows = []
  for case in cases_for(options):
    row = {**compile_case(case, target, device), **provenance}
    rows.append(row)
    log(f"[{row['case']}] {row['status']} in {row['compile_s']} s"
        + (f": total {_gb(row.get('total_bytes'))} GB, predicted "
           f"{_seconds(row.get('predicted_s'))}" if row["status"] == "compiled"
           else f": {row['error']}"))
    _write(options.out, target, rows)
  return rows


def row_provenance(command: str) -> dict:
  """What every row records of how it was made: versions, commit, command,
  date, and the host that compiled it (its CPU model; `device_kind` is the
  target's), which the compile times depend on."""
  from attention_jax import benchmarking  # pylint: disable=g-import-not-at-top
  return {"versions": versions(), "commit": git_commit(), "command": command,
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
          "host_cpu": benchmarking.cpu_model(benchmarking.read_cpuinfo())}


def _write(out: str, target: Target, rows: list[dict], jsonl: bool = True) -> None:
  files = [(".md", summary(rows, target))]
  if jsonl:
    files.append((".jsonl", "".join(json.dumps(r) + "\n" for r in rows)))
  for suffix, text in files:
    path = os.path.join(out, target.name + suffix)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(path + ".tmp", path)


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  try:
    options = parse_options(FLAGS.target, FLAGS.programs, FLAGS.out, FLAGS.kernel_seq_lens,
                            FLAGS.additive_seq_lens, FLAGS.additive_impls)
  except ValueError as e:
    sys.exit(f"error: {e}")
  if FLAGS.report_only:
    try:
      report_only(options.out, options.target)
    except ValueError as e:
      sys.exit(f"error: {e}")
    print(f"wrote {os.path.join(options.out, options.target.name + '.md')}")
    return
  if "jax" in sys.modules:
    sys.exit("error: jax was imported before the compile check could configure it.")
  for key, value in ENVIRONMENT.items():
    os.environ.setdefault(key, value)
  try:
    run(options, command="python -m experiments.compile_check " + " ".join(argv_given()))
  except (ImportError, RuntimeError) as e:
    sys.exit(f"error: {type(e).__name__}: {e} (is this the AOT environment? "
             "bash scripts/aot_env.sh)")


def argv_given() -> list[str]:
  return sys.argv[1:]


if __name__ == "__main__":
  define_flags()
  app.run(main)
