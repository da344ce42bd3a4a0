"""Kernel launches as an NVIDIA GPU sees them, read from XLA:GPU's thunk sequence.

The HLO of a compiled GPU program says which kernels run (`hlo.loop_aware_cost`
counts them), not how the host launches them. XLA:GPU (jax 0.11.2) turns
runs of thunks into command buffers (CUDA graphs) after the HLO passes, on
the thunk sequence itself, so the compiled HLO never shows them: the
program's `*.thunk_sequence_after_thunk_passes.txt` dump does (written with
`--xla_dump_to`; only when a thunk pass changed the sequence, else
`*.thunk_sequence.txt` is what runs). A command buffer is one launch however
many kernels it holds, and a while loop inside one runs on the device (a
conditional graph node) with no host round trip per iteration.

So a launch here is: a command buffer, or a kernel, copy, GEMM or library
call outside one. A loop outside a command buffer launches its condition
and body every iteration and pays the host's check of its predicate
(`host_iterations`). Trip counts are XLA's `known_trip_count` of the while
instruction the thunk was made from (its `profile_annotation` in
`*.thunk_metadata.txt`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

_LINE = re.compile(r"^(\s*)(\d+): (k\w+)\s*(.*)$")
_SECTION = re.compile(r"^(\s*)([a-z][\w ]*):\s*$")
# Thunks that only order or wait, launching nothing themselves.
_NO_LAUNCH = frozenset({"kSequential", "kAsyncDone", "kWaitForStreams", "kAsyncStart",
                        "kDynamicSliceFusion", "kConditional", "kWhile", "kCommandBuffer"})


@dataclasses.dataclass
class Thunk:
  """One thunk of the sequence: its id, kind, the text after its links, and
  its children by section ('' for a plain container; 'condition', 'body'
  for a while loop)."""
  thunk_id: int
  kind: str
  text: str
  sections: dict[str, list["Thunk"]] = dataclasses.field(default_factory=dict)

  def children(self) -> list["Thunk"]:
    return [t for section in self.sections.values() for t in section]


def parse_thunk_sequence(text: str) -> list[Thunk]:
  """The top-level thunks of a `*.thunk_sequence*.txt` dump, each with its
  nested thunks, by indentation (a while loop's under its 'condition:' and
  'body:' headers). Raises ValueError naming the line that is not a thunk."""
  root = Thunk(-1, "root", "")
  stack: list[tuple[int, Thunk]] = [(-1, root)]
  current: dict[int, str] = {}  # id(thunk) -> the section its next children go to
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    indent = len(line) - len(line.lstrip())
    m = _LINE.match(line)
    if m is None:
      s = _SECTION.match(line)
      if s is None or len(stack) < 2:
        raise ValueError(f"`text` line {number} is not a thunk: {line[:120]!r}")
      while len(stack) > 2 and stack[-1][0] > indent:
        stack.pop()
      current[id(stack[-1][1])] = s.group(2)
      continue
    while len(stack) > 1 and stack[-1][0] >= indent:
      stack.pop()
    parent = stack[-1][1]
    thunk = Thunk(int(m.group(2)), m.group(3), m.group(4))
    parent.sections.setdefault(current.get(id(parent), ""), []).append(thunk)
    stack.append((indent, thunk))
  return root.sections.get("", [])


def while_annotations(metadata_text: str) -> dict[int, str]:
  """{thunk id: HLO instruction name} of the while thunks in a
  `*.thunk_metadata.txt` dump."""
  out = {}
  for block in metadata_text.split("thunk_metadata {")[1:]:
    kind = re.search(r'thunk_kind: "(\w+)"', block)
    name = re.search(r'profile_annotation: "([^"]+)"', block)
    tid = re.search(r"thunk_id: (\d+)", block)
    if kind and kind.group(1) == "kWhile" and name:
      out[int(tid.group(1)) if tid else 0] = name.group(1)
  return out


def trip_counts(hlo_text: str) -> dict[str, int]:
  """{while instruction name: XLA's known trip count} of a compiled HLO module."""
  out = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*? while\(.*?\"known_trip_count\":"
                       r"\{\"n\":\"(\d+)\"", hlo_text, re.M):
    out[m.group(1)] = int(m.group(2))
  return out


def launch_count(thunks: list[Thunk], trips: Mapping[int, int]) -> dict[str, int]:
  """Launches, kernels, command buffers and host-side loop iterations of one
  execution of `thunks` (`parse_thunk_sequence`). `trips`: {while thunk id:
  trip count}; a while thunk missing from it raises ValueError naming it
  (an unknown trip count would make every number below a guess)."""
  total = {"launches": 0, "kernels": 0, "command_buffers": 0, "host_iterations": 0,
           "captured_iterations": 0}

  def visit(items, times, captured):
    for t in items:
      if t.kind == "kCommandBuffer":
        if not captured:
          total["launches"] += times
          total["command_buffers"] += times
        visit(t.children(), times, True)
      elif t.kind == "kWhile":
        if t.thunk_id not in trips:
          raise ValueError(f"while thunk {t.thunk_id} has no trip count in `trips`.")
        n = trips[t.thunk_id]
        total["captured_iterations" if captured else "host_iterations"] += times * n
        visit(t.sections.get("condition", []), times * (n + 1), captured)
        visit(t.sections.get("body", []), times * n, captured)
      elif t.kind in _NO_LAUNCH or t.sections:
        visit(t.children(), times, captured)
      else:
        total["kernels"] += times
        if not captured:
          total["launches"] += times
  visit(thunks, 1, False)
  return total


def launches_in_dump(dump_dir: str, module: str) -> dict[str, int]:
  """`launch_count` of the last compiled module named `module` (e.g.
  'jit_step_fn') in an `--xla_dump_to` folder of XLA:GPU: its thunk
  sequence after the thunk passes (the one before them where no pass
  changed it), its while thunks' names and its optimised HLO's trip counts.
  Raises ValueError naming the folder when it holds no such module."""
  import glob  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  metas = sorted(glob.glob(os.path.join(dump_dir, f"module_*.{module}.thunk_metadata.txt")))
  if not metas:
    raise ValueError(f"`dump_dir` {dump_dir} holds no thunk dump of module {module!r}.")
  prefix = metas[-1][:-len("thunk_metadata.txt")]
  after = prefix + "thunk_sequence_after_thunk_passes.txt"
  sequence = after if os.path.exists(after) else prefix + "thunk_sequence.txt"
  hlo_files = glob.glob(prefix + "*gpu_after_optimizations.txt")
  if not hlo_files:
    raise ValueError(f"`dump_dir` {dump_dir} holds no optimised HLO of {prefix}.")
  with open(metas[-1]) as f:
    names = while_annotations(f.read())
  with open(hlo_files[0]) as f:
    trips_by_name = trip_counts(f.read())
  with open(sequence) as f:
    top = parse_thunk_sequence(f.read())
  missing = sorted(n for n in names.values() if n not in trips_by_name)
  if missing:
    raise ValueError(f"loops without a known trip count in {hlo_files[0]}: {missing}")
  return launch_count(top, {tid: trips_by_name[n] for tid, n in names.items()})
