"""Compiling a program for a TPU or an H100 on a CPU-only host, and what XLA says about it.

Needs the AOT environment (`.venv-aot`: libtpu, the CUDA plugin; built by
scripts/aot_env.sh) and its process environment set before jax starts
(`ENVIRONMENT` of the compile check's driver: compile for the described devices
only, never look for a local one).

The model code picks its attention kernel from `jax.default_backend()`,
which is 'cpu' here; while a program is traced it is told the target's
platform (`_backend_as`), so the compiled program is the one the device
would run. `compile_case` gives one row per program: compiled or the error,
XLA's memory analysis and whether it fits, the loop-aware FLOPs and bytes
(`hlo.loop_aware_cost`) and the predicted time (`compile_targets`).
"""

from __future__ import annotations

import contextlib
import importlib
import time
import dataclasses
from typing import Any, Callable

import numpy as np

from attention_jax.measure import compile_targets
from attention_jax.measure import hlo
from attention_jax.measure import provenance as provenance_lib

# What shapes the compiled programs beyond the distributions every row
# records (`provenance.DISTRIBUTIONS`): the TPU and CUDA compilers.
DISTRIBUTIONS = ("libtpu", "jax-cuda13-plugin", "jax-cuda13-pjrt", "nvidia-cudnn-cu13")


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


def _cudnn_version() -> tuple[int, int]:
  v = provenance_lib.versions(["nvidia-cudnn-cu13"])["nvidia-cudnn-cu13"]
  if not v:
    return (9, 12)
  major, minor = v.split(".")[:2]
  return int(major), int(minor)


def target_devices(target: compile_targets.Target) -> list:
  """The compile-only devices of `target`: every chip of its TPU topology
  (described with its chips per host and chip configuration where the target
  gives them: libtpu otherwise describes a v5e:2x4 as two hosts of 4 chips,
  while a v5e-8 is one host of 8), or its H100s (`1x1x<n>`: one slice, one
  host, n GPUs)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if target.platform == "tpu":
    options = {}
    if target.chips_per_host_bounds:
      options["chips_per_host_bounds"] = tuple(target.chips_per_host_bounds)
    if target.chip_config_name:
      options["chip_config_name"] = target.chip_config_name
    topo = topologies.get_topology_desc(topology_name=target.topology, platform="tpu",
                                        **options)
  else:
    config = compile_targets.h100_target_config(_cudnn_version())
    topo = topologies.get_topology_desc(target.name, "cuda", target_config=config,
                                        topology=target.topology or "1x1x1")
  return list(topo.devices)


def target_device(target: compile_targets.Target):
  """One compile-only device of `target` (the first of `target_devices`)."""
  return target_devices(target)[0]


@contextlib.contextmanager
def backend_as(platform: str):
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
def cudnn_probe_on(sharding):
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


def abstract_mesh_of(sharding):
  """Lowering sees the target's device as its abstract mesh: Pallas's Triton
  backend reads the GPU it compiles for from there ('No supported GPU
  devices found' otherwise, on a host without one)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh)


def device_sharding(device):
  """A sharding that places an array whole on `device`."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  return NamedSharding(Mesh(np.array([device]), ("device",)), PartitionSpec())


def _on_device(args, sharding):
  """Every array of `args` as a ShapeDtypeStruct placed by `sharding`."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)


def compile_into(row: dict, lower) -> Any:
  """Compiles what `lower()` returns (a `jax.stages.Lowered`), timing lowering
  and compiling together: `row` gets `status` "compiled" or "error" (its
  exception's first line) and `compile_s`; returns the compiled program, or
  None where either step failed."""
  start = time.perf_counter()
  try:
    compiled = lower().compile()
  except Exception as e:  # pylint: disable=broad-except
    row.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:400]}",
               compile_s=round(time.perf_counter() - start, 2))
    return None
  row.update(status="compiled", compile_s=round(time.perf_counter() - start, 2))
  return compiled


def compile_case(case: Case, target: compile_targets.Target, device) -> dict:
  """Compiles `case` for `device`; the row of what XLA says about it."""
  row = {"program": case.program, "case": case.case, "shapes": case.shapes,
         "target": target.name, "device_kind": getattr(device, "device_kind", None),
         "device_memory_bytes": target.memory_bytes}
  import jax  # pylint: disable=g-import-not-at-top
  sharding = device_sharding(device)
  pallas = None

  def lower():
    nonlocal pallas
    with (backend_as(target.platform), cudnn_probe_on(sharding),
          abstract_mesh_of(sharding)):
      fn, args = case.build()
      lowered = fn.lower(*_on_device(args, sharding))
      if target.platform == "cuda":
        pallas = hlo.pallas_cost_estimates(jax.make_jaxpr(fn)(*_on_device(args, sharding)))
    return lowered

  compiled = compile_into(row, lower)
  if compiled is None:
    return row
  row.update(analyse(compiled, target, pallas))
  if row.get("flops") is None:
    return row
  if case.steps:
    row.update(steps=case.steps, predicted_total_s=case.steps * row["predicted_s"])
  if case.attention_flops:
    row["attention_flops"] = case.attention_flops
    row["predicted_tflops"] = case.attention_flops / row["predicted_s"] / 1e12
  return row


def analyse(compiled, target: compile_targets.Target, pallas: dict | None = None) -> dict:
  """What XLA says of a compiled program (per device, where it spans
  several): its memory analysis and whether it fits the target's memory, the
  target's own cost analysis where it gives one, the fused attention kernel,
  the kernels that only rearrange data (`hlo.layout_copies`), and the loop-aware FLOPs, bytes, kernels and loop iterations with the
  roofline and predicted time (`cost_error` where the HLO could not be
  costed). `pallas`: the Pallas kernels' estimates from the program's jaxpr,
  added where the compiled program carries none (Triton)."""
  row = {}
  mem = compiled.memory_analysis()
  memory = {"argument_bytes": int(mem.argument_size_in_bytes),
            "output_bytes": int(mem.output_size_in_bytes),
            "alias_bytes": int(mem.alias_size_in_bytes),
            "temp_bytes": int(mem.temp_size_in_bytes)}
  row.update(memory, total_bytes=compile_targets.total_bytes(memory),
             fits=compile_targets.fits(memory, target.memory_bytes))
  own = compiled.cost_analysis() or {}
  if isinstance(own, list):  # older jax: one dict per module
    own = own[0] if own else {}
  if own:
    row.update(target_flops=own.get("flops"), target_bytes_accessed=own.get("bytes accessed"),
               target_optimal_seconds=own.get("optimal_seconds"))
  text = compiled.as_text()
  row["fused_attention"] = hlo.fused_attention_kernel(text)
  try:
    copies = hlo.layout_copies(text)
    row.update(layout_copies=copies["kernels"], layout_copy_bytes=copies["bytes"])
  except ValueError as e:  # text the parser does not know: said, the row kept
    row["layout_copies_error"] = str(e)
  try:
    modules = compiled.runtime_executable().hlo_modules()
    cost = hlo.loop_aware_cost(hlo.parsable(modules[0].to_string()), hlo.cpu_cost_analysis)
  except Exception as e:  # pylint: disable=broad-except
    row["cost_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return row
  if pallas and pallas["calls"] and hlo.TRITON_CALL in cost["uncosted_custom_calls"]:
    # The Triton kernels' own estimates, which the compiled program lacks.
    cost["flops"] += pallas["flops"]
    cost["bytes accessed"] += pallas["bytes accessed"]
    row["pallas_costed_from_jaxpr"] = pallas["calls"]
  row.update(flops=cost["flops"], bytes_accessed=cost["bytes accessed"],
             kernels=int(cost["kernels"]), loop_iterations=int(cost["iterations"]),
             loops=cost["loops"], unknown_trip_loops=cost["unknown_trip_loops"],
             uncosted_custom_calls=cost["uncosted_custom_calls"],
             roofline_s=compile_targets.roofline_seconds(
                 cost["flops"], cost["bytes accessed"], target.peak_flops, target.bandwidth),
             predicted_s=compile_targets.predict_seconds(cost, target))
  return row


def row_provenance(command: str | None = None) -> dict:
  """The provenance every compiled row records under `provenance.KEY`: the one
  record (`provenance.fields`) with the compilers' versions too and the
  driver's `command`. Its machine is the host that compiled (the compile
  times depend on its CPU); the row's own `device_kind` is the target's."""
  return provenance_lib.fields(DISTRIBUTIONS, command=command)

