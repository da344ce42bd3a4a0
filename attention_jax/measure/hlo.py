"""The cost of a compiled XLA program read from its HLO text, every loop counted as it runs.

XLA's cost analysis counts a loop body once, whatever its trip count
(checked: a 10-step `lax.scan` of a matmul reports the FLOPs of one step, on
the TPU's own cost model too), and the RNN is loops. So every loop body of a
compiled program is analysed on its own and multiplied by its trip count
(`loop_aware_cost`). The parser is pure text processing (`parse_hlo`); the
cost analysis of one computation is passed in (`cpu_cost_analysis`: XLA's own,
run by the CPU client, since the CUDA plugin's compiled programs report none).

Custom calls XLA does not cost are costed here where their work is known:
cuDNN's flash attention by the FlashAttention count, a Pallas kernel by its
own `pl.CostEstimate` (`custom_call_cost`, `pallas_cost_estimates`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Callable, Mapping, Sequence


CUDNN_ATTENTION_CALL = "__cudnn$fmha"


def fused_attention_kernel(hlo_text: str) -> str | None:
  """'cudnn' when the compiled program calls cuDNN's flash attention, else None."""
  return "cudnn" if CUDNN_ATTENTION_CALL in hlo_text else None



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
  (`attention_jax.measure.benchmarking.attention_flops`) from the call's
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


# Instructions that only move data: a fusion made of these alone is a layout copy.
_MOVES = frozenset({"parameter", "bitcast", "transpose", "copy", "tuple", "get-tuple-element"})
_FUSION_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")


def layout_copies(hlo_text: str) -> dict[str, int]:
  """The kernels of the ENTRY computation of a compiled program that only
  rearrange data (a `copy` or `transpose`, or a fusion of nothing else: what
  XLA inserts where an operand's layout is not the one its user needs, e.g.
  around a custom call that fixes its operands' layout), and the bytes they
  move (each reads its result's size and writes it). Loop bodies are not
  walked: the programs this is read for (one attention call, forward and
  backward) have none. `{"kernels": n, "bytes": b}`."""
  entry, comps = parse_hlo(hlo_text)
  count = moved = 0
  for line in comps[entry].lines[1:]:
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    opcode = m.group(2)
    if opcode == "fusion":
      callee = _FUSION_CALLS.search(line)
      body = comps.get(callee.group(1)) if callee else None
      ops = [b.group(2) for b in map(_INSTRUCTION.match, body.lines[1:]) if b] if body else []
      if not ops or not set(ops) <= _MOVES or not {"transpose", "copy"} & set(ops):
        continue
    elif opcode not in ("transpose", "copy"):
      continue
    count += 1
    result = line.split("=", 1)[1].split(f" {opcode}(")[0]
    moved += 2 * shapes_bytes(result)
  return {"kernels": count, "bytes": moved}


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



# --- collectives --------------------------------------------------------------

# Opcodes that move data between devices (an async pair counted by its start).
COLLECTIVE_OPS = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                            "collective-permute", "collective-broadcast", "ragged-all-to-all"})
_REFERENCES = re.compile(r"\b(calls|to_apply|body|condition)=%?([\w.\-]+)")
_REFERENCE_LISTS = re.compile(r"\b(branch_computations|called_computations)=\{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")
# XLA:GPU's form names mesh axes: `replica_groups=mesh['members'=4,'data'=2] {'data'}`.
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")


def group_size(line: str, num_devices: int) -> int:
  """How many devices take part in each group of a collective: from its
  `replica_groups` (the iota form `[groups, size]<=[n]` or the list form
  `{{0,1},{2,3}}`, or XLA:GPU's mesh axes `mesh['members'=4,'data'=2]
  {'data'}`: the product of the named axes); every device (`num_devices`) where they are empty; 2 for
  a collective-permute (one device sends, one receives)."""
  if " collective-permute" in line:
    return 2
  m = _MESH_GROUPS.search(line)
  if m:
    sizes = {name.strip().strip("'"): int(size)
             for name, size in (axis.split("=") for axis in m.group(1).split(","))}
    named = [a.strip().strip("'") for a in m.group(2).split(",") if a.strip()]
    return math.prod(sizes[a] for a in named) if named else num_devices
  m = _IOTA_GROUPS.search(line)
  if m:
    return int(m.group(1).split(",")[-1])
  m = _LIST_GROUPS.search(line)
  if m and m.group(1):
    return len(m.group(1).split(","))
  return num_devices


def collective_bytes(line: str, opcode: str, group: int) -> int:
  """The buffer a collective works on, in bytes: what is reduced (all-reduce),
  the gathered result (all-gather), the input that is reduced and scattered
  (reduce-scatter: the result x the group), the result otherwise. An async
  start's result is a tuple of its operands and results: the results are
  its second half (all-gather), its first element (collective-permute);
  where the operands are a tuple of their own (`((operands), results)`,
  XLA:GPU), what follows it."""
  kind = opcode.removesuffix("-start")
  result = line.split("=", 1)[1].split(f" {opcode}(")[0].strip()
  start = opcode.endswith("-start")
  if start and result.startswith("(("):
    result, start = result[_closing(result, 1) + 1:], False  # the results alone are left
  shapes = _SHAPE.findall(result)
  sizes = [_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
           for dtype, dims in shapes]
  if start and len(sizes) > 1:
    if kind == "all-gather":
      sizes = sizes[len(sizes) // 2:]
    elif kind == "collective-permute":
      sizes = sizes[:1]
  total = sum(sizes)
  return total * group if kind == "reduce-scatter" else total


def _closing(text: str, start: int) -> int:
  """Index of the bracket that closes the one at `text[start]`."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, "{": 1, ")": -1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return i
  raise ValueError(f"unbalanced brackets in {text[:200]!r}")


def parsable(hlo_text: str) -> str:
  """`hlo_text` in the form the HLO parser of the CPU client reads (for
  `cpu_cost_analysis`): XLA:GPU writes async collectives with attributes
  that parser refuses (`output_to_operand_aliasing` on an all-reduce-start,
  replica groups as mesh axes). Neither changes a cost: the aliasing is
  dropped and the groups become every device (`replica_groups={}`)."""
  out = []
  for line in hlo_text.splitlines():
    key = ", output_to_operand_aliasing={"
    at = line.find(key)
    if at >= 0:
      end = _closing(line, at + len(key) - 1)
      line = line[:at] + line[end + 1:]
    out.append(_MESH_GROUPS.sub("replica_groups={}", line))
  return "\n".join(out)


def collectives(hlo_text: str, num_devices: int) -> list[dict]:
  """The collectives one execution of a compiled SPMD program runs, each
  counted as often as it runs (inside a loop: times its trip count, as in
  `loop_aware_cost`; inside a fusion, call or async computation: as often
  as it is called). Rows `{kind, group_size, count, bytes}` per kind and
  group size, `bytes` summed over the executions (`collective_bytes`),
  sorted by kind and group. `num_devices`: the devices of the program
  (the group of a collective whose replica groups are empty)."""
  entry, comps = parse_hlo(hlo_text)
  trips = {name: {body: (trip if isinstance(trip, int) else 1) for body, trip in comp.whiles}
           for name, comp in comps.items()}
  callees: dict[str, list[tuple[str, int]]] = {}
  for name, comp in comps.items():
    refs = []
    for line in comp.lines[1:]:
      for key, callee in _REFERENCES.findall(line):
        refs.append((callee, trips[name].get(callee, 1) if key == "body" else 1))
      for _, names in _REFERENCE_LISTS.findall(line):
        refs += [(n.strip().lstrip("%"), 1) for n in names.split(",") if n.strip()]
    callees[name] = [(c, times) for c, times in refs if c in comps]

  runs: dict[str, int] = {}

  def visit(name: str, times: int) -> None:
    runs[name] = runs.get(name, 0) + times
    for callee, n in callees[name]:
      visit(callee, times * n)

  visit(entry, 1)
  totals: dict[tuple[str, int], list[int]] = {}
  for name, times in runs.items():
    for line in comps[name].lines[1:]:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      opcode = m.group(2)
      kind = opcode.removesuffix("-start")
      if kind not in COLLECTIVE_OPS or opcode.endswith("-done"):
        continue
      group = group_size(line, num_devices)
      slot = totals.setdefault((kind, group), [0, 0])
      slot[0] += times
      slot[1] += times * collective_bytes(line, opcode, group)
  return [{"kind": kind, "group_size": group, "count": count, "bytes": size}
          for (kind, group), (count, size) in sorted(totals.items())]
