"""Who writes when several processes train one run (`jax.distributed`).

Every process runs the same program on the same data (the global batch is
built identically everywhere and each process feeds its own devices' shards),
so every process computes the same numbers. Only process 0, the primary,
writes anything to the workdir: the lock, metrics, results, reports and
checkpoint checksums. Orbax coordinates the checkpoint files itself.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def is_primary() -> bool:
  """True in the process that writes the workdir (the only one without jax.distributed)."""
  return jax.process_index() == 0


def agree(flag: bool) -> bool:
  """The primary's `flag` in every process (a decision such as "the time budget
  is spent" must be the same everywhere, or one process waits forever)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag, np.bool_)))


def anywhere(flag: bool) -> bool:
  """True in every process if `flag` is True in any (a stop that one process
  was asked for must happen in all at the same step)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.asarray(flag, np.bool_))))


def to_host(x) -> np.ndarray:
  """A device array as numpy in every process, gathered from the other
  processes where it is split across them (a decoded batch, for instance)."""
  if getattr(x, "is_fully_addressable", True) or x.is_fully_replicated:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def sync(name: str) -> None:
  """Waits until every process reached the barrier `name` (nothing to wait for alone)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


# `--coordinator_address=auto`: jax.distributed.initialize() reads the processes
# from the scheduler (SLURM, Open MPI, Kubernetes, Cloud TPU).
AUTO = "auto"


def distributed_problem(address: str | None, num_processes: int | None,
                        process_id: int | None) -> str | None:
  """Why these flags cannot start `jax.distributed` (one line naming them),
  checked before anything connects; None if they can (or ask for nothing)."""
  if address == AUTO:
    if num_processes is not None or process_id is not None:
      return ("`--coordinator_address=auto` reads the processes from the scheduler: give no "
              "`--num_processes` or `--process_id`.")
    return None
  given = [address, num_processes, process_id]
  if any(v is not None for v in given) and any(v is None for v in given):
    return ("`--coordinator_address`, `--num_processes` and `--process_id` must be given "
            "together (or `--coordinator_address=auto` alone under a scheduler).")
  return None
