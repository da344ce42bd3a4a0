"""`--workers`: a sweep's runs trained in parallel, one process per core.

The driver hands out jobs (anything with `config`, `run` and `arm`, e.g.
`sweep.Job`) and a training function; each process loads a job's dataset
once (`datasets.Datasets`), trains it, and the driver writes the reports as
each job finishes.
"""

from __future__ import annotations

import os
import signal
from typing import Callable, Sequence

from attention_jax.training import datasets
from attention_jax.training import host_memory
from attention_jax.training import interrupts
from attention_jax.training import provenance

# Flags meant to make XLA:CPU run a process's programs on one thread. With jax
# 0.10.2 they do not: a 2048^2 float32 matmul still keeps 2 cores busy
# (process CPU time / wall time 1.95 with them, 1.97 without; 318 and 337
# GFLOP/s, 2-core Xeon). Kept in the environment of a worker for older
# versions; what makes it use one core is `use_one_core`.
ONE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def use_one_core(core: int | None = None, *, index: int = 0) -> int | None:
  """Restricts this process to one core and sets `ONE_THREAD_XLA_FLAGS`:
  `core`, or else the `index`-th of the cores it may use (round robin).
  Returns the core; None where affinity is not supported (not Linux). Must run before JAX starts its CPU client, whose thread pools
  are sized from the cores the process may use: pinned, a 2048^2 float32
  matmul ran at 169 GFLOP/s on one core (CPU time / wall 1.0)."""
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                             ONE_THREAD_XLA_FLAGS).strip()
  try:
    allowed = sorted(os.sched_getaffinity(0))
  except AttributeError:
    return None
  core = allowed[index % len(allowed)] if core is None else core
  os.sched_setaffinity(0, {core})
  return core


# A worker's datasets: one at a time.
_DATASETS = datasets.Datasets(limit=1)


def _worker_init(parent_pid: int, stop, counter) -> None:
  """Set-up of a `--workers` process: on a core of its own (the `counter`-th
  the driver may use, round robin), dies with the driver, and stops its run
  as the driver is asked to (`interrupts.watch` of the `stop` event)."""
  interrupts.watch(stop)
  with counter.get_lock():
    index = counter.value
    counter.value += 1
  use_one_core(index=index)
  host_memory.keep_freed_memory()  # before the worker's JAX starts, as the driver does
  try:  # Linux: die with the parent (a `kill -9` of the driver stops its workers too)
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
    os._exit(1)
  provenance.fields()  # as the driver does: the commit as the run starts, not at its first row


def _worker_task(train: Callable, job, deadline: float | None) -> bool:
  """`train(config, run, arm, data, log=, deadline=)` of one job in a worker."""
  interrupts.check()  # asked to stop before this run began: nothing to save
  log = lambda line: print(line, flush=True)
  return train(job.config, job.run, job.arm, _DATASETS.get(job.config), log=log,
               deadline=deadline)


def run_in_workers(workers: int, jobs: Sequence, train: Callable, deadline: float | None,
                   report: Callable) -> bool:
  """Trains `jobs` in `workers` processes with `train` (a module-level
  function: it is sent to them by name); `report(job)` after each finishes.
  False if `deadline` stopped any of them first.

  A stop requested of the driver (SIGTERM, Ctrl-C: `interrupts`) sets an
  event every worker watches: each running run saves its checkpoint after its
  step and the queued ones do not start; once every worker has answered, the
  driver raises `interrupts.Interrupted`.
  """
  import multiprocessing  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context("spawn")  # never fork a process that holds XLA threads
  stop = ctx.Event()
  counter = ctx.Value("i", 0)  # which core the next worker takes
  interrupts.share(stop)
  finished, interrupted = True, False
  with ctx.Pool(min(workers, len(jobs)), initializer=_worker_init,
                initargs=(os.getpid(), stop, counter)) as pool:
    tasks = [(job, pool.apply_async(_worker_task, (train, job, deadline))) for job in jobs]
    for job, task in tasks:
      try:
        finished = task.get() and finished
      except interrupts.Interrupted:
        interrupted = True
        continue
      report(job)
  if interrupted:
    raise interrupts.Interrupted(interrupts.requested() or signal.SIGTERM)
  return finished
