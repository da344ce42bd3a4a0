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
  """Puts batches and replicated arrays where `mesh` (None: the default
  device) says."""

  def __init__(self, mesh: Mesh | None = None):
    self.mesh = mesh

  @property
  def sharded(self) -> bool:
    """Whether batches are split over several devices."""
    return self.mesh is not None and self.mesh.size > 1

  def check_divisible(self, **sizes: int) -> None:
    """A ValueError naming the first of `sizes` (batch sizes by flag name)
    that does not split evenly over the mesh's devices."""
    for name, size in sizes.items():
      if self.sharded and size % self.mesh.size:
        raise ValueError(f"`{name}` ({size}) must be divisible by the number of devices "
                         f"({self.mesh.size}) for data parallelism.")

  def put(self, *arrays) -> tuple:
    """Batch arrays on the devices, split along their first axis when sharded."""
    if not self.sharded:
      return tuple(jnp.asarray(a) for a in arrays)
    return tuple(global_array(a, NamedSharding(self.mesh, P("data"))) for a in arrays)

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
