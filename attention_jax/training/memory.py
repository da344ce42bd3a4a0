"""Memory of a sweep point, measured before it is allocated.

Three questions, asked before any work that could be lost: do the training
state of a point and its training step fit (`check_memory`, from
`jax.eval_shape` of the model's construction, a lower bound of the batch's
logits, then XLA's count of the step compiled for one or two members,
`step_memory`), can one program on the CPU run its members in
turn (`check_members`), and how many sentences per evaluation batch fit
the evaluation budget (`largest_fitting_batch` over `program_bytes` of the
traced program)?
"""

from __future__ import annotations

import os
from typing import Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.data import batching
from attention_jax.training import placement
from attention_jax.training import steps
from attention_jax.training.run_config import RunConfig

# What training keeps of every parameter whatever the batch: the parameter,
# Adam's two moments and the best-validation copy (`state_lib.TrainState`).
COPIES_PER_PARAMETER = 4


def jaxpr_bytes(jaxpr) -> int:
  """Bytes of every input and every value computed in `jaxpr` (a `ClosedJaxpr`
  or `Jaxpr`), with the bodies of loops, branches and nested calls counted
  once each: an upper bound on what the program holds live at any time,
  apart from a loop's carry being both input and output. 0 for None."""
  if jaxpr is None:
    return 0
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)

  def size(var):
    aval = getattr(var, "aval", None)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
      return 0
    # A PRNG key's dtype (`key<fry>`, in a training step's dropout) is no
    # NumPy dtype; it gives its bytes itself.
    itemsize = getattr(dtype, "itemsize", None) or np.dtype(dtype).itemsize
    return int(np.prod(shape, dtype=np.int64)) * int(itemsize)

  def subs(value):
    if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
      yield value
    elif isinstance(value, (tuple, list)):
      for v in value:
        yield from subs(v)

  total = sum(size(v) for v in list(jaxpr.invars) + list(jaxpr.constvars))
  for eqn in jaxpr.eqns:
    total += sum(size(v) for v in eqn.outvars)
    for value in eqn.params.values():
      for sub in subs(value):
        inner = getattr(sub, "jaxpr", sub)
        total += jaxpr_bytes(inner) - sum(size(v) for v in inner.invars)
  return total


def program_bytes(traced, budget: int) -> int:
  """Bytes the traced program `traced` (`jax.jit(f).trace(...)`) needs: a
  cheap upper bound when that fits `budget`, else XLA's memory analysis of
  the compiled program (arguments, outputs and temporaries)."""
  # Every value the program makes, summed, twice over (a loop's carry
  # exists as input and output of its body) bounds what it can hold at
  # once; when that bound fits, the compiler's own count is not needed.
  bound = 2 * jaxpr_bytes(traced.jaxpr)
  if bound <= budget:
    return bound
  memory = traced.lower().compile().memory_analysis()
  return int(memory.argument_size_in_bytes + memory.output_size_in_bytes
             + memory.temp_size_in_bytes)


def largest_fitting_batch(measure: Callable[[int], int], budget: int, limit: int,
                          what: str) -> int:
  """The largest batch up to `limit` whose program, of `measure(size)` bytes,
  fits `budget`. Memory grows linearly with the batch, so a line through the
  sizes measured so far proposes the next, kept strictly between the largest
  size known to fit and the smallest known not to. A ValueError naming
  `what` (the program and split) and the budget if one sentence does not fit."""
  fits, fails = 0, limit + 1
  size, seen = limit, {}
  while fails - fits > 1:
    seen[size] = measure(size)
    if seen[size] <= budget:
      fits = size
    else:
      fails = size
    if fails - fits <= 1:
      break
    (b0, m0), (b1, m1) = sorted(seen.items())[:1] * 2 if len(seen) == 1 else sorted(
        seen.items(), key=lambda kv: abs(kv[1] - budget))[:2]
    slope = (m1 - m0) / (b1 - b0) if b1 != b0 else m0 / b0
    guess = int(b0 + (budget - m0) / slope) if slope > 0 else fits + 1
    size = min(max(guess, fits + 1), fails - 1)
  if fits == 0:
    raise ValueError(
        f"{what} needs {seen[1] / 2**30:.1f} GiB for one sentence, over the evaluation "
        f"budget of {budget / 2**30:.1f} GiB (--eval_memory_gb); raise it or make the "
        "model smaller.")
  return fits


def evaluation_budget(eval_memory_gb: float, workers: int) -> int:
  """Bytes one evaluation program may use: `eval_memory_gb` GiB, or (0) half
  the memory the program runs in, shared by the `workers`: on an accelerator
  its own (`bytes_limit`), on the CPU what the system has available now. The
  host's memory says nothing of a GPU's: on the first GPU sweep (an H200 on a
  host of 128 GiB) the budget was half the host's RAM. Workers that each have
  a GPU or chip of their own are held to the same share, which only makes
  their evaluation batches smaller (the batch changes no number), because
  this process cannot tell them from workers sharing one device."""
  if eval_memory_gb:
    return int(eval_memory_gb * 2**30)
  device = accelerator_memory()
  return int(0.5 * (available_memory() if device is None else device) / max(workers, 1))


def state_bytes(run: RunConfig, data) -> tuple[int, int]:
  """`(parameters of one model, bytes of the training state of the ensemble)`
  of one sweep point: `COPIES_PER_PARAMETER` copies of every parameter for
  each of the run's members (`run.num_members`: its seeds at every member
  value). From `jax.eval_shape` of the model's
  construction: nothing is allocated, so an absurd size is measured, not
  attempted. Activations and evaluation come on top."""
  model_cls, model_config = run.build_model(data)
  abstract = nnx.eval_shape(lambda: model_cls(model_config, rngs=nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  count = sum(int(np.prod(x.shape, dtype=np.int64)) for x in leaves)
  size = sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize for x in leaves)
  return count, size * COPIES_PER_PARAMETER * run.num_members


def step_bytes(run: RunConfig, data) -> int:
  """A lower bound on the bytes one training step holds besides the state,
  linear in `--batch_size`: two arrays every model keeps from its forward
  pass until its backward pass needs them, so both are held when the
  backward pass starts: the output logits (float32: the loss's softmax is
  float32 whatever `--dtype`), one row of the vocabulary per target
  position, and the encoder's output (the gradient of the first attention
  projection reads it), 2 × `hidden_dim` per source position for the
  bidirectional RNN, `d_model` for the Transformer. Counted for each of
  the run's members (`run.num_members`), float32, at the narrowest padded
  length a training batch can have (`batching.padded_length` of the shortest pair, + <eos>: a
  batch's sources and targets share one length). The step holds gradients
  and every other activation besides, so a batch refused by this bound
  cannot fit and no batch that could fit is refused."""
  sources, targets = data.token_ids("train")
  shortest = int(np.maximum(sources.lengths, targets.lengths).min(initial=1))
  width = int(batching.padded_length(shortest + 1))
  model = run.model
  encoder = model.encoder_dim if run.family == "rnn" else model.d_model
  per_position = int(data.tokenizer.vocab_size) + encoder
  return 4 * run.num_members * run.data.batch_size * width * per_position


def widest_training_batch(run: RunConfig, data) -> int:
  """The padded length of the widest batch the training stream can give:
  its longest pair within `--max_length` (+ <eos>), on the batch grid."""
  sources, targets = data.token_ids("train")
  lengths = np.maximum(sources.lengths, targets.lengths) + 1
  kept = lengths[lengths <= run.data.max_length]
  return int(batching.padded_length(int(kept.max(initial=1))))


def _step_analysis(run: RunConfig, data, members: int, compiled: bool) -> int:
  """Bytes one training step of `members` members of `run` holds besides
  its arguments' training state, at the widest training batch, on one
  device: with `compiled`, XLA's memory analysis of the step compiled as
  the trainer compiles it (its temporaries, its outputs not written in place
  of the donated state, and the batch); without, an upper bound from the
  traced program alone (`jaxpr_bytes` twice over, the state included).
  Nothing is allocated: the state is abstract (`jax.eval_shape`)."""
  model_cls, model_config = run.build_model(data)
  abstract = nnx.eval_shape(lambda: model_cls(model_config, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  stack = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((members,) + tuple(x.shape), x.dtype), tree)
  params, rest = stack(params), stack(rest)
  tx = run.optimizer.make(run.member_fields)
  opt_state = jax.eval_shape(jax.vmap(tx.init), params)
  batch = jax.ShapeDtypeStruct((run.data.batch_size, widest_training_batch(run, data)),
                               jnp.int32)
  program = steps.ensemble_train_step(
      graphdef, tx, tuple(range(members)), placement.Placement(None),
      pad_id=data.tokenizer.pad_id, label_smoothing=run.optimizer.label_smoothing,
      dropout=run.model.dropout > 0.0)
  traced = program.trace(params, rest, opt_state, jax.ShapeDtypeStruct((), jnp.int32),
                         batch, batch, batch)
  if not compiled:
    return 2 * jaxpr_bytes(traced.jaxpr)
  analysis = traced.lower().compile().memory_analysis()
  batch_bytes = 3 * int(np.prod(batch.shape)) * 4
  return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes
             - analysis.alias_size_in_bytes) + batch_bytes


def step_memory(run: RunConfig, data, budget: float) -> int:
  """Bytes a training step of the run's members needs besides its training
  state (`state_bytes`), close to what XLA will allocate, for
  `check_memory`. Measured on programs of one and two members, never of
  all of them (thousands of members in turn make a program that takes
  hours to compile): where the traced bound of one member's step times the
  members is within `budget`, that bound; else XLA's count for one member
  times the members, where that is within `budget`; else XLA's counts for
  one and two members, extrapolated along the members (vmapped, every
  member's activations are held at once; in turn on the CPU, XLA may free
  one member's before the next's, so the second member may add less than
  the first). The lower bound the check makes first (`step_bytes`) was
  about 40 times below this count at `--batch_size=100000`."""
  e = run.num_members
  bound = _step_analysis(run, data, 1, compiled=False)
  if e * bound <= budget:
    return e * bound
  one = _step_analysis(run, data, 1, compiled=True)
  if e * one <= budget or e == 1:
    return e * one
  two = _step_analysis(run, data, 2, compiled=True)
  return one + (e - 1) * max(two - one, 0)


def _members(run: RunConfig) -> str:
  """How a message counts a run's models: its seeds, or its members."""
  if not run.member_axes:
    return f"{run.seeds} seed(s)"
  values = run.num_members // run.seeds
  return f"{run.num_members} members ({run.seeds} seed(s) x {values} values)"


def _size(n: float) -> str:
  """Bytes as a message shows them: GiB, or MiB below one GiB (a share of
  the memory divided among many --workers printed as '0.0 GiB')."""
  return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_memory(run: RunConfig, data, available: int | None = None,
                 shared: bool = True) -> None:
  """A ValueError of one line, naming the flags to change, if the point
  `run` cannot fit in the memory it would live in (`training_memory()`
  unless `available` is given), shared by the `run.workers` processes that
  train at once (unless not `shared`: each has `available` to itself): its
  training state (`state_bytes`) and one training step's batch
  (`step_bytes`, a lower bound; then `step_memory`, XLA's count of the
  compiled step), or an evaluation budget
  (`--eval_memory_gb`) larger than that share. Called before anything is
  made: a size that cannot fit ends in one line and no workdir, not in an
  out-of-memory traceback after the workdir was made."""
  count, state = state_bytes(run, data)
  step = step_bytes(run, data)
  available = training_memory() if available is None else available
  share = max(run.workers, 1) if shared else 1
  shared_text = f", shared by {share} --workers" if share > 1 else ""
  if state + step > available / share:
    raise ValueError(
        f"{run.arm.label}: {_members(run)} of {count:,} parameters need "
        f"{_size(state)} for the parameters, Adam moments and best copy, and a training "
        f"batch of {run.data.batch_size:,} sentences at least {_size(step)} for its logits and "
        f"encoder output, over the {_size(available / share)} of memory available{shared_text}; "
        f"{_advice(state, step, available, share)}.")
  # The bound above is far below a step's need (its gradients and every
  # other activation): XLA's count of the compiled step, close to it, decides.
  need = step_memory(run, data, available / share - state)
  if state + need > available / share:
    raise ValueError(
        f"{run.arm.label}: a training step of {_members(run)} on batches of "
        f"{run.data.batch_size:,} sentences needs about {_size(need)} (XLA's memory analysis "
        f"of the compiled step) besides the {_size(state)} of the parameters, Adam moments and "
        f"best copy, over the {_size(available / share)} of memory available{shared_text}; "
        f"{_advice(state, need, available, share)}.")
  budget = run.evaluation.eval_memory_gb * 2**30
  if budget > available / share:
    raise ValueError(
        f"--eval_memory_gb={run.evaluation.eval_memory_gb:g} is over the "
        f"{_size(available / share)} of memory available{shared_text}; lower it (0 = half of "
        "that).")


# The most members one program runs in turn (on the CPU, `placement.over_members`):
# the members are unrolled into it, so its compile grows with them, and again
# for every batch shape, faster than linearly (the smoke preset's training
# step on a busy 2-core AMD EPYC, in turn: traced and compiled in 10 s with
# 0.77 GB of peak memory for 2 members, 24 s and 0.88 GB for 8, 257 s and
# 2.6 GB for 32). 5,000 learning rates as members reached 16.7 GB without a
# first step after 12 minutes.
MAX_IN_TURN_MEMBERS = 32


def check_members(run: RunConfig, member_groups: int = 1) -> None:
  """A ValueError of one line naming --members and --seeds where one
  program would run more than `MAX_IN_TURN_MEMBERS` members in turn: on the
  CPU (`placement.in_turn_default`), where the members of each of the
  `member_groups` device groups (a `members` mesh) share one program. Vmapped
  programs (accelerators, a `members,data` mesh) do not grow with the
  members: their bound is the memory (`check_memory`)."""
  per_program = -(-run.num_members // max(member_groups, 1))
  if not placement.in_turn_default() or per_program <= MAX_IN_TURN_MEMBERS:
    return
  where = f" on each of {member_groups} devices" if member_groups > 1 else ""
  raise ValueError(
      f"--members / --seeds: {_members(run)} would run in turn in one program{where}, over "
      f"the {MAX_IN_TURN_MEMBERS} the CPU takes (its compile grows faster than the members, "
      "once for each batch shape: 24 s for 8 members of the smoke preset, 257 s for 32); give "
      "fewer, or split the values over several --workdir.")


def _advice(state: int, step: int, available: float, share: int) -> str:
  """Which flags would make a refused point fit: fewer --workers where one
  process alone would fit, else the flags that size the larger part."""
  if share > 1 and state + step <= available:
    return "lower --workers (one of them alone fits)"
  if step > state:
    return "lower --batch_size or --seeds"
  return ("lower --dims (--dim of experiments.train), --hidden_dim, --embed_dim, --ff_dim, "
          "--vocab_size or --seeds")


def training_memory() -> int:
  """Bytes the training state may take: an accelerator's own memory (its
  `bytes_limit`; with data parallelism every device holds a replica), else
  what the system has available (`available_memory`)."""
  device = accelerator_memory()
  return available_memory() if device is None else device


def accelerator_memory() -> int | None:
  """The first device's `bytes_limit` where it is an accelerator that reports
  one (what XLA's allocator may take of it), else None (the CPU)."""
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return None


def available_memory() -> int:
  """Bytes of memory the system can still give (Linux `MemAvailable`; with no
  /proc/meminfo, the physical memory)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
