"""Where a compiled training step's time goes on XLA:CPU: its trace, by part of the model.

The step is compiled with XLA:CPU's per-thunk trace marks
(`xla_cpu_enable_xprof_traceme`) and run under `jax.profiler.trace`; each
thunk's time is attributed to the part of the model its op comes from and to
forward or backward (`breakdown`). The RNN's parts are its and the train
step's `jax.named_scope`s (`part_of`): encoder (with the decoder's start: the
bridge and the keys' projection), decoder, output layer, loss, optimizer;
dropout masks by their random-bit ops. XLA fuses the RNN's output-layer
product into the softmax's max, so its forward product shows up in `loss`.
The Transformer has no scopes of its own: its parts come from the call stack
XLA keeps for every op (`hlo_stack_frames`, `transformer_part_of`): each self
and cross attention split into projections and the rest, the FFNs,
LayerNorm, embeddings, output layer, with the step's loss and optimizer
scopes. The trace marks slow a step down by 5-10%.
"""

from __future__ import annotations

import collections
import re

import jax


# Where a traced step's time goes: each thunk XLA:CPU ran, by the part of the
# model its op belongs to (the `jax.named_scope`s of the model and the train
# step in its HLO metadata) and by direction (forward, or backward: the op
# comes from a `transpose(...)` of autodiff). Checked in this order.
PARTS = (("dropout masks", ("_bernoulli", "_uniform", "threefry", "random_bits")),
         ("optimizer", ("(optimizer)", "/optimizer/")), ("loss", ("(loss)", "/loss/")),
         ("output layer", ("(output)", "/output/")), ("decoder", ("(decoder)", "/decoder/")),
         ("encoder", ("(encoder)", "/encoder/")))


def hlo_op_names(hlo_text: str) -> dict:
  """Instruction name -> `op_name` of its metadata, from a compiled module's text."""
  found = re.finditer(r'^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?metadata=\{op_name="([^"]*)"',
                      hlo_text, re.M)
  return {m.group(1): m.group(2) for m in found}


def part_of(op_name: str, functions: tuple = ()) -> tuple[str, str]:
  """`(part, direction)` of an op of the RNN's step: PARTS' name or "other",
  "forward" / "backward". (`functions` is unused: the RNN names its parts by scopes.)"""
  del functions
  direction = "backward" if "transpose(" in op_name else "forward"
  for part, keys in PARTS:
    if any(k in op_name for k in keys):
      return part, direction
  return "other", direction


def hlo_stack_frames(hlo_text: str) -> dict:
  """Instruction name -> the functions of the Python call stack that made
  its op, outermost first, from a compiled module's text.

  The Transformer has no `jax.named_scope`s of its own (and its code may not
  change while experiments run on it), but JAX records each op's call stack
  and XLA prints it after the module: tables FunctionNames, FileLocations
  (a function per location) and StackFrames (a location and a parent frame
  per frame), and each instruction's `stack_frame_id`. jax 0.10.2's XLA
  prints a frame's parent as its id + 1 (a root's as 1); a table whose roots
  say 0 is read as it stands."""

  def table(title: str) -> dict:
    block = re.search(rf"^{title}\n((?:\d+ [^\n]*\n?)*)", hlo_text, re.M)
    rows = re.findall(r"^(\d+) (.*)$", block.group(1), re.M) if block else []
    return {int(i): text for i, text in rows}

  functions = {i: text.strip('"') for i, text in table("FunctionNames").items()}
  location = {i: int(re.search(r"function_name_id=(\d+)", text).group(1))
              for i, text in table("FileLocations").items()}
  frames = {i: (int(re.search(r"file_location_id=(\d+)", text).group(1)),
                int(re.search(r"parent_frame_id=(\d+)", text).group(1)))
            for i, text in table("StackFrames").items()}
  shift = 0 if any(parent == 0 for _, parent in frames.values()) else 1

  def stack(frame: int) -> tuple:
    names = []
    while frame in frames and len(names) <= len(frames):
      loc, parent = frames[frame]
      names.append(functions.get(location.get(loc), "?"))
      frame = parent - shift
    return tuple(reversed(names))

  found = re.finditer(r'^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?metadata=\{[^}\n]*?'
                      r'stack_frame_id=(\d+)', hlo_text, re.M)
  return {m.group(1): stack(int(m.group(2))) for m in found}


def transformer_part_of(op_name: str, functions: tuple) -> tuple[str, str]:
  """`(part, direction)` of an op of the Transformer's step, from the step's
  scopes (loss, optimizer; dropout by its random-bit ops) and the model
  functions on its call stack (`hlo_stack_frames`): the encoder's or the
  decoder's self attention, the cross attention (with the keys' and values'
  projection of the encoder output, made in `Transformer.__call__`), each
  split into its projections (the Linear layers) and the rest (scores,
  softmax, weighted sum, the heads' reshapes); the FFNs; LayerNorm with the
  residual adds; the embeddings; the output layer (tied embedding)."""
  direction = "backward" if "transpose(" in op_name else "forward"
  called = set(functions)
  if "Dropout.__call__" in called or any(k in op_name for k in PARTS[0][1]):
    return "dropout", direction
  for part, scopes in (("optimizer", ("(optimizer)", "/optimizer/")),
                       ("loss", ("(loss)", "/loss/"))):
    if any(k in op_name for k in scopes):
      return part, direction
  if "Transformer.logits" in called:
    return "output layer", direction
  if "Transformer._embed" in called:
    return "embeddings", direction
  stack = "encoder" if "EncoderLayer.__call__" in called else (
      "decoder" if "DecoderLayer.__call__" in called else None)
  if "FeedForward.__call__" in called:
    return f"{stack} FFN", direction
  if "DecoderLayer.__call__.<locals>.cross_attention" in called or (
      stack is None and "MultiHeadAttention.project_kv" in called):
    attention = "cross attention"
  elif "MultiHeadAttention.__call__" in called or (
      "DecoderLayer.__call__.<locals>.self_attention" in called):
    attention = f"{stack} self attention"
  else:
    attention = None
  if attention:
    what = "projections" if "Linear.__call__" in called else "scores, softmax, sum"
    return f"{attention}: {what}", direction
  if "LayerNorm.__call__" in called or "_Block._residual" in called:
    return f"{stack} LayerNorm + residual", direction
  return "other", direction


def thunk_times(events) -> list:
  """`(start_ns, duration_ns, name)` of each thunk run on one thread, loops excluded.

  XLA:CPU's trace (`--xla_cpu_enable_xprof_traceme`) marks a thunk by an
  event named after it, lasting as long as the thunk, and one named
  "end: <name>". A loop's own event does not always cover its body's thunks
  (the forward scans' events end before their bodies run), so a loop's time
  is that of the thunks of its body, each attributed by its own op name."""
  return sorted((start, dur, name) for start, dur, name in events
                if not name.startswith(("end: ", "ThunkExecutor", "while")))


def breakdown(xspace_path: str, hlo_text: str, steps: int, step_seconds: float,
              attribute=part_of) -> list:
  """Rows of where a traced step's time goes (module docstring, 3), per step:
  for each part and direction (`attribute(op_name, functions)`: `part_of`
  for the RNN, `transformer_part_of`) the milliseconds of its thunks, of them
  in loop bodies and in matrix products, and its thunks per step; then the
  time between thunks (thunk dispatch, loop control, the host)."""
  names = hlo_op_names(hlo_text)
  stacks = hlo_stack_frames(hlo_text)
  data = jax.profiler.ProfileData.from_file(xspace_path)
  acc = collections.defaultdict(collections.Counter)
  for plane in data.planes:
    for line in plane.lines:
      if not line.name.startswith("tf_XLA"):
        continue
      for _, dur, name in thunk_times((e.start_ns, e.duration_ns, e.name)
                                      for e in line.events):
        op = names.get(name, "")
        c = acc[attribute(op, stacks.get(name, ()))]
        c["ms"] += dur / 1e6
        c["thunks"] += 1
        if "/while/body" in op:
          c["loop_ms"] += dur / 1e6
          c["loop_thunks"] += 1
        if name.startswith("dot") or "dot_general" in op:
          c["matmul_ms"] += dur / 1e6
  busy = sum(c["ms"] for c in acc.values()) / steps
  rows = [{"part": part, "direction": direction, "ms": c["ms"] / steps,
           "loop_ms": c["loop_ms"] / steps, "matmul_ms": c["matmul_ms"] / steps,
           "thunks": c["thunks"] / steps, "loop_thunks": c["loop_thunks"] / steps}
          for (part, direction), c in sorted(acc.items(), key=lambda kv: -kv[1]["ms"])]
  rows.append({"part": "between thunks", "direction": "-",
               "ms": max(0.0, step_seconds * 1e3 - busy), "loop_ms": 0.0, "matmul_ms": 0.0,
               "thunks": 0.0, "loop_thunks": 0.0})
  return rows
