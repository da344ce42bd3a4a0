"""Where the trainer's arrays live: one device, or a data-parallel mesh.

With a mesh of several devices (`Mesh(devices, ("data",))`) every batch is
split over them along its first axis and the parameters are replicated; a
process may hold only some of the devices (several processes, `multihost`).
"""

from __future__ import annotations

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
