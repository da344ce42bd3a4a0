"""Training steps compiled for several devices: the members split over them, or the batch.

A multi-device target (`compile_targets`: `h100x8`, `tpu_v5e_8`,
`tpu_v4_32`) is a set of compile-only devices (`compile_device.target_devices`).
Each `MeshCase` is one training step laid out on a `(members, data)` mesh of
them (`placement.member_mesh`) by the library's own placement
(`placement.over_members_on`, `stacked_sharding`, `batch_sharding`), so the
program compiled is the one a trainer with that mesh runs:

- `members`: the stacked member axis E of the parameters, optimiser state
  and non-parameter state split over the devices, each device its E / m
  members; the batch whole on every device. No communication in the step.
- `members,data`: fewer members than devices; the members over m groups and
  each batch split over the d devices of a group (gradients summed in it).
- `data`: today's data parallelism: every member on every device, the batch
  split over all of them, every member's gradients all-reduced.

The row of a case (`compile_mesh_case`) is `compile_device`'s (memory per
device, loop-aware FLOPs and bytes of the per-device program) with the
step's collectives read from the compiled HLO (`hlo.collectives`: kind,
executions, bytes, group size), their predicted time
(`compile_targets.collective_seconds`), `num_devices`, the mesh and the
number of hosts its devices span.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from experiments.compile_check import cases as compile_cases
from attention_jax.measure import compile_device
from attention_jax.measure import compile_targets
from attention_jax.measure import hlo


@dataclasses.dataclass
class MeshCase:
  """One training step on a `(members, data)` mesh of `members x data`
  devices: `build(mesh)` gives `(jitted function, args)`, the args
  ShapeDtypeStructs placed on the mesh's devices. `members` counts the member
  groups (mesh axis), `num_members` the members E, `padding` how many of
  them are there only to fill the groups (`pad_members`)."""
  program: str
  case: str
  shapes: dict
  scheme: str
  members: int
  data: int
  num_members: int
  build: Callable[..., tuple[Callable, tuple]]
  steps: int | None = None  # steps of this program in its sweep
  runs: int = 1  # how many times the sweep runs this program's steps
  padding: int = 0

  @property
  def num_devices(self) -> int:
    return self.members * self.data


def pad_members(num_members: int, groups: int) -> int:
  """The least multiple of `groups` that holds `num_members`: members that do
  not split over the groups are padded with extra members (more seeds or
  values), which train as the others and are discarded, rather than leaving
  some devices with fewer members (a program per device count)."""
  if num_members < 1 or groups < 1:
    raise ValueError(f"`num_members` ({num_members}) and `groups` ({groups}) must be >= 1.")
  return -(-num_members // groups) * groups


def pad_grid(seeds: int, values: int, groups: int) -> tuple[int, int]:
  """The fewest `(seeds', values')`, at least `(seeds, values)`, whose
  product (the members of a run: every seed at every value) splits over
  `groups` (ties: fewer seeds). 3 seeds x 7 learning rates on 8 devices:
  3 x 8 = 24; on 16: 4 x 8 = 32."""
  if min(seeds, values, groups) < 1:
    raise ValueError(f"`seeds` ({seeds}), `values` ({values}) and `groups` ({groups}) "
                     "must be >= 1.")
  best = None
  for s in range(seeds, seeds + groups + 1):
    for v in range(values, values + groups + 1):
      if (s * v) % groups == 0 and (best is None or s * v < best[0] * best[1]):
        best = (s, v)
  return best


def member_step(trainer, mesh) -> Callable:
  """The trainer's own training step (`EnsembleTrainer._build_train_step`:
  one optimiser step of every member on one batch, parameters and optimiser
  state donated) as the trainer builds it for `mesh`. The trainer was made
  without one (its arrays stay on this host); only its placement is told
  the mesh, so the program is laid out on the target's devices."""
  from attention_jax.training import placement  # pylint: disable=g-import-not-at-top
  trainer.placement = placement.Placement(mesh)
  return trainer._build_train_step()  # pylint: disable=protected-access


def train_step_mesh_case(program: str, case: str, cfg, arm, scheme: str, members: int,
                         data: int, steps: int | None = None, runs: int = 1,
                         wanted: int | None = None) -> MeshCase:
  """The training step of `cfg` at `arm` with its members (`cfg.seeds` x
  the values of `cfg.members`; `wanted` of them real, the rest padding) on
  a `members x data` mesh, at the widest training batch."""
  total = len(cfg.run_members())
  if total % members:
    raise ValueError(f"{total} members do not split over `members` = {members} groups.")
  if cfg.batch_size % data:
    raise ValueError(f"batch {cfg.batch_size} does not split over `data` = {data} devices.")

  def build(mesh):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from attention_jax.data import batching  # pylint: disable=g-import-not-at-top
    from attention_jax.training import placement  # pylint: disable=g-import-not-at-top
    from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top
    width = int(batching.padded_length(cfg.max_length + 1))
    trainer = train_lib.EnsembleTrainer(
        cfg.point(arm), compile_cases.ShapeOnlyData(cfg.vocab_size, cfg.max_length))
    stacked, batch = placement.stacked_sharding(mesh), placement.batch_sharding(mesh)
    like = lambda tree, sharding: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
    ints = jax.ShapeDtypeStruct((cfg.batch_size, width), jnp.int32, sharding=batch)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = (like(trainer.params, stacked), like(trainer.rest, stacked),
            like(trainer.opt_state, stacked),
            jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated), ints, ints, ints)
    return member_step(trainer, mesh), args

  from attention_jax.data import batching  # pylint: disable=g-import-not-at-top
  width = int(batching.padded_length(cfg.max_length + 1))
  shapes = dict(model=cfg.model, arm=arm.name, dim=arm.attention_dim, seeds=cfg.seeds,
                member_values=cfg.members or None, members=total, batch=cfg.batch_size,
                length=width, vocab=cfg.vocab_size, dtype=cfg.dtype)
  return MeshCase(program, case, shapes, scheme, members, data, total, build, steps=steps,
                  runs=runs, padding=total - (total if wanted is None else wanted))


def hosts_of(devices: Sequence) -> int:
  """How many processes (hosts) the devices belong to."""
  return len({getattr(d, "process_index", 0) for d in devices})


def compile_mesh_case(case: MeshCase, target: compile_targets.Target, devices: Sequence) -> dict:
  """Compiles `case` on the first `case.num_devices` of `devices`; the row of
  what XLA says of the per-device program, its collectives and the predicted
  step (`predicted_s`: the per-device roofline and overheads plus the
  collectives' time)."""
  used = list(devices)[:case.num_devices]
  if len(used) < case.num_devices:
    raise ValueError(f"case {case.case!r} needs {case.num_devices} devices; target "
                     f"{target.name} has {len(devices)}.")
  row = {"program": case.program, "case": case.case, "shapes": case.shapes,
         "target": target.name, "device_kind": getattr(used[0], "device_kind", None),
         "device_memory_bytes": target.memory_bytes, "scheme": case.scheme,
         "num_devices": case.num_devices, "mesh": {"members": case.members, "data": case.data},
         "hosts": hosts_of(used), "members": case.num_members, "padding": case.padding,
         "steps": case.steps, "runs": case.runs}
  import jax  # pylint: disable=g-import-not-at-top
  from attention_jax.training import placement  # pylint: disable=g-import-not-at-top
  mesh = placement.member_mesh(used, case.members, case.data)

  def lower():
    # The cuDNN probe compiles for one of the devices; lowering sees the
    # mesh as its context (shard_map checks that they agree).
    with (compile_device.backend_as(target.platform),
          compile_device.cudnn_probe_on(compile_device.device_sharding(used[0])),
          jax.sharding.use_abstract_mesh(mesh.abstract_mesh)):
      fn, args = case.build(mesh)
      return fn.lower(*args)

  compiled = compile_device.compile_into(row, lower)
  if compiled is None:
    return row
  row.update(compile_device.analyse(compiled, target))
  if row.get("flops") is None:
    return row
  text = compiled.as_text()
  collectives = hlo.collectives(text, case.num_devices)
  row["collectives"] = collectives
  row["collective_s"] = compile_targets.collective_seconds(collectives, target)
  row["compute_s"] = row["predicted_s"]
  row["predicted_s"] = row["compute_s"] + row["collective_s"]
  if case.steps:
    row["predicted_total_s"] = case.runs * case.steps * row["predicted_s"]
  return row


# --- the programs -------------------------------------------------------------

# The learning-rate grid of the `transformer_lr` preset (its docstring's
# command): 7 learning rates x 3 seeds at every (layer norm, score, d_k);
# 2 layer norms x 4 scores share each d_k's program, whose cost does not
# depend on them (the scores differ by a scale or a norm of q and k).
LR_GRID_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
LR_GRID_LAYER_NORMS = 2
# The arm whose cells stand for every (layer norm, score) of a d_k.
LR_GRID_ARM = "scaled_dot"

PROGRAMS = ("gpu_members", "gpu_members_data", "gpu_data", "lr_grid", "lr_grid_data")


# The `gpu` sweep's arm whose step is compiled at each dimension, standing
# for all three: additive. On one H100 it is the slowest at every dimension
# (results/compile_check: 84-109 ms against 83-93 ms for multiplicative and
# scaled_multiplicative), on one v5e within 2% of the slowest (75-115 ms
# against 75-117 ms), so the sweep's predicted time, 3 x the additive cells,
# is about the sum over the arms. Compiling the other 8 cells of three
# layouts on three targets would take hours of the 2-core machine.
GPU_MESH_ARM = "additive"
GPU_MESH_ARMS_STOOD_FOR = 3


def gpu_sweep_mesh_cases(program: str, num_devices: int) -> list[MeshCase]:
  """The `gpu` preset's step at every dimension (the additive arm,
  standing for the 3 arms: `GPU_MESH_ARM`) on `num_devices`:
  `gpu_members` its E members split over gcd(E, n) devices, one member
  group each and no data axis (with fewer members than devices, the rest
  idle); `gpu_members_data` the members over gcd(E, n) groups and each batch
  over the n / gcd devices of a group (`placement.mesh_shape`); `gpu_data`
  today's data parallelism over all n."""
  import math  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.training import placement  # pylint: disable=g-import-not-at-top
  cfg = config_lib.from_preset("gpu")
  if program == "gpu_members":
    scheme, (members, data) = "members", (math.gcd(cfg.seeds, num_devices), 1)
  elif program == "gpu_members_data":
    scheme = "members,data"
    members, data = placement.mesh_shape(scheme, cfg.seeds, num_devices)
  elif program == "gpu_data":
    scheme, (members, data) = "data", placement.mesh_shape("data", cfg.seeds, num_devices)
  else:
    raise ValueError(f"`program` must be one of gpu_members, gpu_members_data, gpu_data; "
                     f"got {program!r}.")
  return [train_step_mesh_case(program, arm.label, cfg, arm, scheme, members, data,
                               steps=cfg.steps, runs=GPU_MESH_ARMS_STOOD_FOR)
          for arm in cfg.replace(arms=(GPU_MESH_ARM,)).sweep()]


def lr_grid_mesh_cases(program: str, num_devices: int) -> list[MeshCase]:
  """The `transformer_lr` grid's step at each d_k (`LR_GRID_ARM`, standing
  for every score and layer norm): `lr_grid` one program per (layer norm,
  score, d_k) whose 7 x 3 = 21 members are every learning rate
  (`--members=learning_rate=...`, the rate in the optimiser state) at every
  seed, split over all n devices: padded (`pad_grid`) to 3 seeds x 8 rates
  = 24 on 8 devices and 4 x 8 = 32 on 16, the extra members computed and
  discarded; `lr_grid_data` today's way, a run of 3 seeds per learning rate,
  data-parallel over all n."""
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  import experiments  # pylint: disable=g-import-not-at-top
  experiments.add_study_presets()  # `transformer_lr` is the threshold study's
  base = config_lib.from_preset("transformer_lr")
  scores = len(base.arms)
  cells = base.replace(arms=(LR_GRID_ARM,)).sweep()
  wanted = len(LR_GRID_RATES) * base.seeds
  if program == "lr_grid":
    seeds, rates = pad_grid(base.seeds, len(LR_GRID_RATES), num_devices)
    # The padding rates go on by half decades; their values change no cost.
    values = list(LR_GRID_RATES)
    while len(values) < rates:
      values.append(values[-2] * 10)
    cfg = base.replace(seeds=seeds,
                       members="learning_rate=" + ",".join(f"{v:g}" for v in values))
    return [train_step_mesh_case(program, f"{arm.label} ({wanted} members)", cfg, arm,
                                 "members", num_devices, 1, steps=cfg.steps,
                                 runs=LR_GRID_LAYER_NORMS * scores, wanted=wanted)
            for arm in cells]
  if program == "lr_grid_data":
    return [train_step_mesh_case(program, f"{arm.label} ({base.seeds} members)", base, arm,
                                 "data", 1, num_devices, steps=base.steps,
                                 runs=LR_GRID_LAYER_NORMS * scores * len(LR_GRID_RATES))
            for arm in cells]
  raise ValueError(f"`program` must be lr_grid or lr_grid_data; got {program!r}.")


def mesh_cases(program: str, num_devices: int) -> list[MeshCase]:
  """The cases of one of `PROGRAMS` on `num_devices` devices."""
  if program.startswith("gpu_"):
    return gpu_sweep_mesh_cases(program, num_devices)
  return lr_grid_mesh_cases(program, num_devices)
