"""Where the trainer's arrays live: one device, or a data-parallel mesh; and
how the members (seeds) of an ensemble share one compiled program.

With a mesh of several devices (`Mesh(devices, ("data",))`) every batch is
split over them along its first axis and the parameters are replicated; a
process may hold only some of the devices (several processes, `multihost`).

The trainer stacks the members' parameters and optimiser states on a leading
axis E and runs every program over it. `over_members(fn, in_axes)` is that
program: `jax.vmap(fn, in_axes)` on accelerators, where one batched program
fills a device that one member does not; on CPU, the members one after
another inside the same program (`in_turn`). The function is the same; on CPU
vmap makes every matrix product a batched one, which XLA:CPU runs slower than
the members' own products in turn: the quick model's training step for two
seeds took 524 ms vmapped and 393 ms in turn (multiplicative a = 128; 992 and
762 ms for additive a = 1024), one core of the 2-core Xeon, jax 0.10.2
(results/cpu_efficiency).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np


def global_array(x, sharding):
  """`x` (the same in every process) placed with `sharding`, built from each
  process's own copy. `jax.device_put` of a process-local array onto devices
  of several processes gave arrays Orbax could not save (one buffer spanning
  both processes' devices; JAX 0.10.2, two CPU processes)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


class Placement:
  """Puts batches, the members' stacked arrays and replicated arrays where
  `mesh` (None: the default device) says: a `("data",)` mesh or a
  `(members, data)` one (`member_mesh`)."""

  def __init__(self, mesh: Mesh | None = None):
    self.mesh = mesh

  @property
  def sharded(self) -> bool:
    """Whether the programs run over several devices."""
    return self.mesh is not None and self.mesh.size > 1

  @property
  def data_devices(self) -> int:
    """How many devices each batch is split over (the mesh's `data` axis)."""
    return axis_size(self.mesh, DATA)

  @property
  def member_groups(self) -> int:
    """How many device groups the members are split over (`members` axis)."""
    return axis_size(self.mesh, MEMBERS)

  def check_divisible(self, **sizes: int) -> None:
    """A ValueError naming the first of `sizes` (batch sizes by flag name)
    that does not split evenly over the devices of the `data` axis."""
    for name, size in sizes.items():
      if size % self.data_devices:
        raise ValueError(f"`{name}` ({size}) must be divisible by the number of devices "
                         f"({self.data_devices}) for data parallelism.")

  def check_members(self, members: int) -> None:
    """A ValueError where `members` do not split over the member groups."""
    if members % self.member_groups:
      raise ValueError(f"{members} members do not split over the mesh's {self.member_groups} "
                       "member groups (`--mesh`): give a multiple of them (seeds x member "
                       "values) or `--mesh=members,data`.")

  def put(self, *arrays) -> tuple:
    """Batch arrays on the devices, split along their first axis over `data`."""
    if not self.sharded:
      return tuple(jnp.asarray(a) for a in arrays)
    return tuple(global_array(a, batch_sharding(self.mesh)) for a in arrays)

  def replicated(self, array):
    """`array` (the same in every process) as a device array beside the parameters."""
    if self.mesh is None:
      return jnp.asarray(array)
    return global_array(array, NamedSharding(self.mesh, P()))

  def replicate_tree(self, tree):
    """Every leaf of `tree` replicated on the mesh's devices (unchanged when not sharded)."""
    if not self.sharded:
      return tree
    return jax.tree.map(lambda x: global_array(x, NamedSharding(self.mesh, P())), tree)

  def stacked_sharding(self) -> NamedSharding | None:
    """Where arrays stacked over the members live: split over the `members`
    axis (whole on every device without one); None without a mesh."""
    if self.mesh is None:
      return None
    return NamedSharding(self.mesh, P(MEMBERS) if MEMBERS in self.mesh.axis_names else P())

  def layout(self) -> dict[str, int]:
    """What a checkpoint records of where it was trained (`layout_change`):
    the devices, and how many member groups and data devices they form."""
    return {"devices": 1 if self.mesh is None else int(self.mesh.size),
            "members": self.member_groups, "data": self.data_devices}

  def stack_tree(self, tree):
    """Every leaf of `tree`, stacked over the members on its leading axis,
    where `stacked_sharding` says (unchanged when not sharded)."""
    if not self.sharded:
      return tree
    sharding = self.stacked_sharding()
    return jax.tree.map(lambda x: global_array(x, sharding), tree)


def describe_layout(layout: dict[str, int]) -> str:
  """`Placement.layout()` in words: '1 device', '2 devices (members 2 x data 1)'."""
  if layout["devices"] == 1:
    return "1 device"
  return f"{layout['devices']} devices (members {layout['members']} x data {layout['data']})"


def layout_change(saved: dict | None, now: dict[str, int]) -> str | None:
  """The line a run resumed on another layout than its checkpoint's says,
  or None for the same layout (or a checkpoint that records none, written
  before layouts were recorded).

  Its numbers from there are not quite an uninterrupted run's: XLA compiles
  each layout's program apart, and they round differently. Data
  parallelism sums the gradients in another order; and the members split
  over devices run inside `shard_map`, which XLA compiles another way: the
  Transformer's softmax gradient divides by the row sums where the
  one-device program multiplies by their reciprocal, a float32 rounding
  apart (docs/method.md)."""
  if not isinstance(saved, dict) or saved == now:
    return None
  try:
    then = describe_layout(saved)
  except KeyError:
    return None
  return (f"its checkpoint was trained on {then}, this run is on {describe_layout(now)}: "
          "from here its numbers may differ from an uninterrupted run's in float32 "
          "rounding (docs/method.md)")


def in_turn_default() -> bool:
  """Whether programs run the members in turn here: on CPU, yes."""
  return jax.default_backend() == "cpu"


def over_members(fn: Callable, in_axes: Sequence[int | None], *,
                 in_turn: bool | None = None) -> Callable:
  """`fn` applied to every member: arguments with `in_axes` 0 are stacked
  over the members (their leading axis), those with None are shared; every
  output is stacked over the members, as `jax.vmap(fn, in_axes)` returns it.

  `in_turn` None: `in_turn_default()`. In turn, the members are a Python loop
  traced into the one program, so its size (and compile time) grows with E.
  """
  in_axes = tuple(in_axes)
  if any(axis not in (0, None) for axis in in_axes):
    raise ValueError(f"`in_axes` must hold 0 or None, got {in_axes}.")
  if not any(axis == 0 for axis in in_axes):
    raise ValueError("`in_axes` must stack at least one argument over the members.")
  if not (in_turn_default() if in_turn is None else in_turn):
    return jax.vmap(fn, in_axes=in_axes)

  def in_turn_fn(*args):
    if len(args) != len(in_axes):
      raise TypeError(f"expected {len(in_axes)} arguments (in_axes), got {len(args)}.")
    stacked = [a for a, axis in zip(args, in_axes) if axis == 0]
    members = jax.tree.leaves(stacked)[0].shape[0]
    outputs = [fn(*(jax.tree.map(lambda x, i=i: x[i], a) if axis == 0 else a
                    for a, axis in zip(args, in_axes)))
               for i in range(members)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outputs)

  return in_turn_fn


# --- the member axis over devices -------------------------------------------
#
# The members of an ensemble share nothing but their batches: member e's
# parameters, optimiser state and update depend on member e alone. So the
# stacked axis E splits over devices with no communication in a step: each
# device holds E / m members and runs them as the one-device program would.
# Data parallelism (`data`) is a second mesh axis, for cells with fewer
# members than devices: the batch is split over it and the gradients summed
# over it (an all-reduce within each group of `data` devices).

MEMBERS = "members"
DATA = "data"
SCHEMES = ("auto", "members", "data", "members,data")


def member_mesh(devices: Sequence, members: int, data: int = 1) -> Mesh:
  """A `(members, data)` mesh over `devices` (in their order): the member
  axis split over `members` groups, the batch over `data` devices in each."""
  devices = list(devices)
  for name, size in (("members", members), ("data", data)):
    if not (isinstance(size, (int, np.integer)) and size >= 1):
      raise ValueError(f"`{name}` must be an integer >= 1, got {size!r}.")
  if members * data != len(devices):
    raise ValueError(f"`members` x `data` ({members} x {data}) must equal the number of "
                     f"devices ({len(devices)}).")
  return Mesh(np.asarray(devices, dtype=object).reshape(members, data), (MEMBERS, DATA))


def mesh_shape(scheme: str, num_members: int, num_devices: int) -> tuple[int, int]:
  """`(members, data)` sizes of the mesh `scheme` gives `num_members` on
  `num_devices` devices; a ValueError naming `--mesh` where they do not fit.

  'members': every device holds `num_members / num_devices` members (must
  divide); 'data': the batch split over every device, the members on each
  (today's data parallelism); 'members,data': the member axis over the
  largest number of groups that divides both, the batch over the devices of
  each group; 'auto': 'members' when there are at least as many members as
  devices, else 'members,data'.
  """
  for name, size in (("num_members", num_members), ("num_devices", num_devices)):
    if not (isinstance(size, (int, np.integer)) and size >= 1):
      raise ValueError(f"`{name}` must be an integer >= 1, got {size!r}.")
  if scheme not in SCHEMES:
    raise ValueError(f"`--mesh` must be one of {', '.join(SCHEMES)}; got {scheme!r}.")
  if scheme == "auto":
    scheme = "members" if num_members >= num_devices else "members,data"
  if scheme == "data":
    return 1, num_devices
  if scheme == "members,data":
    groups = math.gcd(num_members, num_devices)
    return groups, num_devices // groups
  if num_members % num_devices:
    raise ValueError(f"`--mesh=members`: {num_members} members do not split over "
                     f"{num_devices} devices; give a multiple of {num_devices} members "
                     "(seeds x learning rates) or `--mesh=members,data`.")
  return num_devices, 1


def stacked_sharding(mesh: Mesh) -> NamedSharding:
  """Where arrays stacked over the members (leading axis E) live: split over
  the mesh's `members` axis, whole on each device of a `data` group."""
  return NamedSharding(mesh, P(MEMBERS))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Where a batch lives: split along its first axis over the mesh's `data`
  axis, the same on every member group."""
  return NamedSharding(mesh, P(DATA) if DATA in mesh.axis_names else P())


def axis_size(mesh: Mesh | None, name: str) -> int:
  """The size of `mesh`'s axis `name`; 1 without a mesh or without that axis."""
  if mesh is None or name not in mesh.axis_names:
    return 1
  return int(mesh.shape[name])


def over_members_on(mesh: Mesh | None, fn: Callable, in_axes: Sequence[int | None], *,
                    in_turn: bool | None = None) -> Callable:
  """`over_members(fn, in_axes)` with its member axis split over `mesh`'s
  `members` axis.

  Members alone (no `data` axis, or one of size 1): each device runs
  `over_members` on its own members (vmapped on accelerators, in turn on
  CPU) inside a `jax.shard_map` over the whole mesh, so the program has no
  communication and each device computes what one device would for those
  members. Members x data: the members vmapped (never in turn: taking one
  member of an array split over devices would gather it), the layout left
  to the compiler, which splits the batch and sums the gradients over `data`
  exactly as one device computes them. (A `shard_map` manual over `members`
  only would do the same, but jax's custom partitioning, which cuDNN's
  attention uses, fails inside it: jax 0.11.2.) Without a mesh, or with one
  member group, it is `over_members`.
  """
  if axis_size(mesh, MEMBERS) == 1:
    return over_members(fn, in_axes, in_turn=in_turn)
  if axis_size(mesh, DATA) > 1:
    return over_members(fn, in_axes, in_turn=False)
  specs = tuple(P(MEMBERS) if axis == 0 else P() for axis in in_axes)
  return jax.shard_map(over_members(fn, in_axes, in_turn=in_turn), mesh=mesh, in_specs=specs,
                       out_specs=P(MEMBERS), check_vma=False)
