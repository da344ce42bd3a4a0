"""`--workers`: a sweep's runs trained in parallel, one process per core, or
per group of devices.

On a CPU-only host each worker is pinned to a core (`use_one_core`). On a
host of GPUs the devices are split into one group per worker
(`device_groups`), or, with more workers than GPUs, several workers share
each GPU (`gpu_share`): each worker process sees only its own
(`CUDA_VISIBLE_DEVICES`; on CPU, the test's stand-in, its own number of host
devices) and lays each run's members out on them as `--mesh` says. On a TPU
VM each worker opens one chip of its own (`tpu_groups`), and the driver,
which must not open any (libtpu gives a chip to one process), counts them
from the PCI bus (`tpu_chips`) and stays on the CPU.

The driver hands out jobs (anything with a `label`, e.g. `runner.Job`) to
worker processes and a module-level training function `train(job, log=,
deadline=)`; it writes the reports as each job finishes.

The driver watches its workers instead of waiting on them: a worker that
dies (the kernel's out-of-memory killer sends SIGKILL) or a run that raises
is named in one line as it happens, the other runs go on to their end, and
the driver ends with `RunsFailed` naming every failed run, whose last
checkpoint is kept for a rerun to resume. A stop asked of the driver
(SIGTERM, Ctrl-C) reaches every worker, whose run saves its checkpoint after
its step, dead workers or not.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Callable, Sequence

from attention_jax.sweep import host_memory
from attention_jax.training import interrupts
from attention_jax.measure import provenance

# Flags meant to make XLA:CPU run a process's programs on one thread. With jax
# 0.10.2 they do not: a 2048^2 float32 matmul still keeps 2 cores busy
# (process CPU time / wall time 1.95 with them, 1.97 without; 318 and 337
# GFLOP/s, 2-core Xeon). Kept in the environment of a worker for older
# versions; what makes it use one core is `use_one_core`.
ONE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

# How often the driver looks at its workers when none has answered: a
# worker's death is noticed within this many seconds (and a signal's
# handler runs) however long the runs are.
POLL_SECONDS = 1.0


class RunsFailed(Exception):
  """Some runs of a sweep failed (`failures`: one "[label] why" each, of
  `total` runs), and `finished` of the runs finished (by default all the
  others). The message counts them: a sweep where every worker failed to
  start once said "The others finished" when none had."""

  def __init__(self, failures: Sequence[str], total: int, finished: int | None = None):
    self.failures, self.total = list(failures), total
    self.finished = total - len(self.failures) if finished is None else finished
    done = ("None finished" if self.finished == 0 else
            f"{self.finished} of {total} finished and are reported")
    super().__init__(
        f"{len(self.failures)} of {total} runs failed: "
        + "; ".join(f.rstrip(".") for f in self.failures) + f". {done}; a run whose "
        "training failed keeps its last checkpoint: re-run the same command to resume it.")


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


FORCE_DEVICES = "--xla_force_host_platform_device_count"


def device_groups(workers: int, platform: str, num_devices: int,
                  environ: dict | None = None) -> list[dict[str, str]]:
  """The environment of each of `workers` processes sharing this host's
  `num_devices` devices of `platform`: a group of `num_devices / workers`
  devices each, in order. GPU: `CUDA_VISIBLE_DEVICES`, numbered within the
  driver's own (`environ`'s, where it sets one); where `workers` is a
  multiple of the GPUs instead, `workers / num_devices` workers share each
  GPU (`gpu_share`), so that one GPU can train several small runs at once.
  CPU (several host devices, as tests make them): the group's size as XLA's
  host device count. A ValueError naming `--workers` where the devices do
  not split evenly, or on a TPU, whose chips this project does not split
  between processes."""
  environ = os.environ if environ is None else environ
  share = gpu_share(workers, num_devices) if platform == "gpu" else 1
  if workers < 1 or (share == 1 and num_devices % workers):
    also = " or be a multiple of them (GPUs shared)" if platform == "gpu" else ""
    raise ValueError(f"`--workers` = {workers} must divide the {num_devices} devices of "
                     f"this host{also} (one group of devices per worker process).")
  size = max(num_devices // workers, 1)
  if platform == "gpu":
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if d.strip()] or [str(i) for i in range(num_devices)]
    if len(visible) != num_devices:
      raise ValueError(f"`--workers`: CUDA_VISIBLE_DEVICES names {len(visible)} devices but "
                       f"jax sees {num_devices}.")
    if share > 1:  # worker i on GPU i // share, as many workers on each
      return [{"CUDA_VISIBLE_DEVICES": visible[i // share]} for i in range(workers)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(visible[i * size:(i + 1) * size])}
            for i in range(workers)]
  if platform == "cpu":
    kept = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(FORCE_DEVICES)]
    return [{"XLA_FLAGS": " ".join(kept + [f"{FORCE_DEVICES}={size}"])}
            for _ in range(workers)]
  raise ValueError(f"`--workers` = {workers} on {num_devices} {platform} devices: this "
                   "project splits a host's devices between worker processes on GPUs, and "
                   "on a TPU VM one chip per worker (`tpu_groups`, which the driver "
                   "chooses before it opens any); use --workers=1 and `--mesh` (the members "
                   "of each run over every device).")


def gpu_share(workers: int, num_devices: int) -> int:
  """How many `--workers` processes share each of `num_devices` GPUs: 1
  where the workers split the GPUs (or cannot be laid out at all), else
  `workers / num_devices`. A run of the `gpu` preset does not fill an H200:
  three times its members took 1.67 times its step (12 members 38.8 ms, 4
  members 23.3 ms; results/gpu_h200/2026-11-27), so separate runs may share
  one too. Whether processes sharing a GPU gain as members do has not been
  measured on one. Each such worker allocates GPU memory as it needs it
  (`XLA_PYTHON_CLIENT_PREALLOCATE=false`) and compiles on every host core,
  where a worker of a CPU-only host is held to one core (`use_one_core`)."""
  if workers > num_devices >= 1 and workers % num_devices == 0:
    return workers // num_devices
  return 1


# High-bandwidth memory per chip, GiB, by jax's name of the TPU generation
# (`jax._src.hardware_utils.TpuVersion`), as Cloud TPU's system-architecture
# pages publish it: what a worker's run has on its one chip. The driver,
# which never opens a chip, checks each run against this before any work
# (every generation `tpu_groups` accepts is here).
TPU_HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "tpu7x": 192}

# TPU generations whose chip is one jax device (v4 on: one megacore per
# chip); on v2 and v3 a chip is two, which `tpu_groups` does not lay out.
ONE_DEVICE_TPU_CHIPS = ("v4", "v5e", "v5p", "v6e", "tpu7x")

# The first port of the workers' libtpu instances, one port each
# (`TPU_PROCESS_PORT`): 8476 is libtpu's own default, and the ports of
# two sweeps on one VM would clash, as their chips would.
TPU_BASE_PORT = 8476


def tpu_chips() -> tuple[int, str | None]:
  """The TPU chips attached to this host, and their generation's name
  (`TpuVersion`, e.g. 'v5e'), read from the PCI bus as jax itself does
  before it starts a backend: (0, None) on a host without one, or where this
  jax has no such reader."""
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
    count, version = hardware_utils.num_available_tpu_chips_and_device_id()
  except (ImportError, AttributeError, OSError):
    return 0, None
  return count, (None if version is None else version.name)


def tpu_groups(workers: int, chips: int, version: str | None,
               base_port: int = TPU_BASE_PORT) -> list[dict[str, str]]:
  """The environment of each of `workers` processes on a TPU VM of `chips`
  chips: worker i opens chip i alone, as a one-chip slice of its own
  (libtpu's topology variables: chip and process bounds 1,1,1, the chip it
  may see, a port of its own, several libtpu instances allowed on the VM;
  the recipe of jax's own multi-process tests for one chip). A ValueError
  naming `--workers` where there are more workers than chips or a chip is
  two devices (v2, v3). With fewer workers than chips the rest stay idle."""
  if workers < 1 or workers > chips:
    raise ValueError(f"`--workers` = {workers} on a TPU VM of {chips} chips: each worker "
                     f"opens one chip of its own; give at most {chips}.")
  if version not in ONE_DEVICE_TPU_CHIPS:
    raise ValueError(f"`--workers` = {workers} on TPU {version} chips: a worker per chip is "
                     f"laid out for chips of one device ({', '.join(ONE_DEVICE_TPU_CHIPS)}); "
                     "use --workers=1 and `--mesh`.")
  groups = []
  for i in range(workers):
    port = str(base_port + i)
    groups.append({"TPU_VISIBLE_CHIPS": str(i), "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
                   "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": port,
                   "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "CLOUD_TPU_TASK_ID": "0",
                   "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
  return groups


# The modules the driver imported for `--import` (a score of one's own), which
# a worker process, started afresh, imports too before it builds a model.
IMPORTS_ENV = "ATTENTION_JAX_IMPORT"


def import_modules(names) -> None:
  """Imports each module `--import` names (its `registry.register` calls add
  its scores), in this process and, through `IMPORTS_ENV`, in every
  `--workers` process; a ValueError of one line naming the flag and the
  module where one cannot be imported. The flag stays in the command the
  result rows record, so `--report_only` and a re-run import it too."""
  import importlib  # pylint: disable=g-import-not-at-top
  names = [n.strip() for n in names if n.strip()]
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())  # as `python -m` does: the current folder's modules
  for name in names:
    try:
      importlib.import_module(name)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"`--import`: cannot import {name!r}: {type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}") from None
  if names:
    os.environ[IMPORTS_ENV] = ",".join(names)


def _import_driver_modules() -> None:
  import importlib  # pylint: disable=g-import-not-at-top
  for name in filter(None, os.environ.get(IMPORTS_ENV, "").split(",")):
    importlib.import_module(name)


def _worker_init(parent_pid: int, stop, index: int, environment: dict | None = None) -> None:
  """Set-up of a `--workers` process: on a core of its own (the `index`-th
  the driver may use, round robin), or, given the `environment` of a device
  group (`device_groups`), on those devices alone; dies with the driver, and
  stops its run as the driver is asked to (`interrupts.watch` of the `stop`
  event). Before the worker's JAX starts its backend, which reads them."""
  interrupts.watch(stop)
  if environment is None:
    use_one_core(index=index)
  else:
    os.environ.update(environment)
    if "JAX_PLATFORMS" in environment:  # jax read it as it was imported, with the job
      import jax  # pylint: disable=g-import-not-at-top
      jax.config.update("jax_platforms", environment["JAX_PLATFORMS"])
  host_memory.keep_freed_memory()  # before the worker's JAX starts, as the driver does
  try:  # Linux: die with the parent (a `kill -9` of the driver stops its workers too)
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
    os._exit(1)
  provenance.fields()  # as the driver does: the commit as the run starts, not at its first row
  _import_driver_modules()


def why(error: BaseException) -> str:
  """One line saying what went wrong: the message of the errors this
  project raises for bad input and state (ValueError, OSError with the file
  it names), the type and message of anything else."""
  if isinstance(error, OSError) and error.strerror:
    return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
  if isinstance(error, ValueError):
    return str(error)
  return f"{type(error).__name__}: {error}"


def last_line(error: BaseException) -> str:
  """The last line of what `error`'s traceback ends with (`why`): a failed
  backend start chains a dozen frames of jax's own, and its last line says
  what went wrong (libtpu missing, a chip in use)."""
  lines = [line.strip() for line in why(error).splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  if len(lines) > 1 and not isinstance(error, (OSError, ValueError)):
    return f"{type(error).__name__}: {lines[-1]}"
  return lines[-1]


def _worker_main(parent_pid: int, stop, index: int, conn, train: Callable,
                 deadline: float | None, environment: dict | None = None) -> None:
  """A worker's life: jobs from `conn` until None, each answered with
  ('finished', bool), ('interrupted', signum) or ('failed', one line). A
  worker whose set-up failed (a TPU chip it cannot open) fails each job it
  is given with that reason, so every run says why instead of each worker
  dying with a bare exit status."""
  try:
    _worker_init(parent_pid, stop, index, environment)
    broken = None
  except Exception as e:  # pylint: disable=broad-except
    # One line, not the ~45 of the traceback (of jax's backend start, the
    # same in every worker): the runs it is given each fail saying why too.
    broken = "its worker could not start: " + last_line(e)
    print(f"worker {index}: {broken[len('its worker '):]}", file=sys.stderr, flush=True)
  log = lambda line: print(line, flush=True)
  while True:
    try:
      job = conn.recv()
    except EOFError:  # the driver is gone
      return
    if job is None:
      return
    if broken is not None:
      conn.send(("failed", broken))
      continue
    try:
      interrupts.check()  # asked to stop before this run began: nothing to save
      answer = ("finished", bool(train(job, log=log, deadline=deadline)))
    except interrupts.Interrupted as e:
      answer = ("interrupted", e.signum)
    except Exception as e:  # pylint: disable=broad-except
      if not isinstance(e, (ValueError, OSError)):  # a bug: its traceback helps
        traceback.print_exc()
      answer = ("failed", why(e))
    conn.send(answer)


def death(exitcode: int | None) -> str:
  """How a worker process ended, in words."""
  if exitcode is not None and exitcode < 0:
    name = signal.Signals(-exitcode).name
    hint = (" (the kernel's out-of-memory killer sends it: see `dmesg`)"
            if -exitcode == signal.SIGKILL else "")
    return f"its worker process was killed by {name}{hint}"
  return f"its worker process exited with status {exitcode}"


class _Worker:
  """A worker process and the driver's end of its pipe."""

  def __init__(self, ctx, stop, index: int, train: Callable, deadline: float | None,
               group: int | None = None, environment: dict | None = None):
    self.conn, child = ctx.Pipe()
    self.group = group  # the index of its device group, if it has one
    self.process = ctx.Process(
        target=_worker_main,
        args=(os.getpid(), stop, index, child, train, deadline, environment), daemon=True)
    self.process.start()
    child.close()  # the child's end lives in the child only: its death closes the pipe
    self.job = None

  def answer(self):
    """The worker's answer to its job, None while it works, or ('died', why)."""
    if self.conn.poll():
      try:
        return self.conn.recv()
      except (EOFError, OSError):
        pass
    elif self.process.is_alive():
      return None
    self.process.join(timeout=10)
    return ("died", death(self.process.exitcode))

  def close(self, timeout: float = 30) -> None:
    """Ends the worker once its job (if any) has answered, within `timeout` s."""
    if self.process.is_alive():
      try:
        self.conn.send(None)
      except OSError:
        pass
    self.process.join(timeout=timeout)
    if self.process.is_alive():
      self.process.kill()
      self.process.join()
    self.conn.close()


def run_in_workers(workers: int, jobs: Sequence, train: Callable, deadline: float | None,
                   report: Callable, log: Callable[[str], None] = print,
                   environments: Sequence[dict] | None = None) -> bool:
  """Trains `jobs` in `workers` processes with `train` (a module-level
  function, or a `functools.partial` of one: it is sent to them by name);
  `report(job)` after each finishes. False if `deadline` stopped any of them
  first. With `environments` (`device_groups`, at least `workers` of them),
  worker i runs with the i-th instead of on a core, and a worker started in
  place of a dead one takes the dead one's.

  A stop requested of the driver (SIGTERM, Ctrl-C: `interrupts`) sets an
  event every worker watches: each running run saves its checkpoint after its
  step and the queued ones do not start; once every worker has answered, the
  driver raises `interrupts.Interrupted`. A run that fails or whose worker
  dies is named at once; the others go on (a dead worker is replaced while
  jobs wait), and `RunsFailed` names them all at the end. So is a finished
  run whose `report` raised: a report is no reason to stop the others (it
  once set the stop event, and every running run stopped with a line saying
  it was asked to).
  """
  if environments is not None and len(environments) < workers:
    raise ValueError(f"`--workers` = {workers} needs as many device groups; "
                     f"{len(environments)} given.")
  import multiprocessing  # pylint: disable=g-import-not-at-top
  from multiprocessing import connection  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context("spawn")  # never fork a process that holds XLA threads
  stop = ctx.Event()
  interrupts.share(stop)
  started = 0  # workers started so far: the next one takes the next core

  def start(group: int) -> _Worker:
    nonlocal started
    started += 1
    environment = None if environments is None else dict(environments[group])
    return _Worker(ctx, stop, started - 1, train, deadline, group, environment)

  queue = list(jobs)
  pool = [start(i) for i in range(min(workers, len(queue)))]
  failed: list[str] = []
  finished, interrupted = True, False
  done = 0  # runs trained to their end and reported: what RunsFailed counts as finished
  patience = 30  # seconds an idle worker gets to exit
  try:
    while True:
      stopping = interrupted or interrupts.requested() is not None
      for worker in pool:
        if worker.job is None and queue and not stopping:
          worker.job = queue.pop(0)
          worker.conn.send(worker.job)
      busy = [w for w in pool if w.job is not None]
      if not busy:
        break
      connection.wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                      timeout=POLL_SECONDS)
      for worker in busy:
        answer = worker.answer()
        if answer is None:
          continue
        job, worker.job = worker.job, None
        kind, value = answer
        if kind == "finished":
          finished = value and finished
          try:
            report(job)
            done += bool(value)
          except Exception as e:  # pylint: disable=broad-except  # named, never a stop
            failed.append(f"[{job.label}] its reports could not be written: {why(e)}")
            log(f"[{job.label}] finished, but its reports could not be written: {why(e)}; "
                "the other runs go on")
        elif kind == "interrupted":
          interrupted = True
        else:
          failed.append(f"[{job.label}] {value}")
          log(f"[{job.label}] failed: {value}; the other runs go on")
          if kind == "died":
            pool.remove(worker)
            worker.close()
            if queue:
              pool.append(start(worker.group))
  except BaseException:
    # The driver itself failed: every running run saves its checkpoint after
    # its step before the error is raised.
    stop.set()
    patience = 600
    raise
  finally:
    for worker in pool:
      worker.close(patience)
  if interrupted or interrupts.requested() is not None:
    raise interrupts.Interrupted(interrupts.requested() or signal.SIGTERM)
  if failed:
    raise RunsFailed(failed, len(jobs), finished=done)
  return finished


# --- the driver's choice of devices for its runs, made before any run ---


def device_mesh(cfg, scheme: str, devices: Sequence | None = None):
  """The `(members, data)` mesh of `devices` (default: every device of every
  process) that `scheme` (`--mesh`) gives the members of `cfg`'s runs, or
  None for a single device. A ValueError naming the flag where the members
  or the batches do not split over it."""
  import jax  # pylint: disable=g-import-not-at-top
  from attention_jax.training import placement  # pylint: disable=g-import-not-at-top
  devices = jax.devices() if devices is None else list(devices)
  if len(devices) == 1:
    return None
  members, data = placement.mesh_shape(scheme, len(cfg.run_members()), len(devices))
  mesh = placement.member_mesh(devices, members, data)
  placement.Placement(mesh).check_divisible(batch_size=cfg.batch_size,
                                            eval_batch_size=cfg.eval_batch_size)
  return mesh


def worker_groups(cfg, scheme: str):
  """With `--workers` > 1 on a host of several devices, or of GPUs: the
  environment of each worker's group of devices and the bytes of memory
  each group has to itself (None where the workers share the host's);
  (None, None) otherwise (a CPU: a core per worker). A ValueError naming
  the flag, before any work, where the devices do not split, or the members
  or batches do not split over a group.

  GPUs (`workers.device_groups`): the driver only counts them; it starts its
  client without taking their memory, which the workers will
  (`XLA_PYTHON_CLIENT_PREALLOCATE` of the command line, if any, is theirs;
  else jax's default where each worker has its GPUs to itself, and no
  preallocation where several share one, each checked against its share of
  the GPU's memory).
  A TPU VM (`workers.tpu_groups`, one chip per worker): the driver counts
  the chips without opening any (libtpu gives a chip to one process) and
  runs on the CPU itself; each worker is held to the TPU (`JAX_PLATFORMS`),
  so that a chip it cannot open is a failed run, not one trained on the CPU."""
  if cfg.workers <= 1:
    return None, None
  import jax  # pylint: disable=g-import-not-at-top
  from attention_jax.training import memory  # pylint: disable=g-import-not-at-top
  platforms = host_memory.requested_platforms()
  chips, version = tpu_chips() if not platforms or "tpu" in platforms else (0, None)
  if chips:
    if distributed_started():
      raise ValueError(_with_processes(cfg))
    if backend_started():
      raise ValueError(f"`--workers` = {cfg.workers} on a TPU VM: this process has already "
                       "started a JAX backend, which holds the chips its workers need; start "
                       "a fresh one.")
    groups = tpu_groups(cfg.workers, chips, version)
    jax.config.update("jax_platforms", "cpu")  # the driver keeps off the chips
    for environment in groups:
      environment["JAX_PLATFORMS"] = ",".join(platforms) or "tpu"
    hbm = TPU_HBM_GIB.get(version)
    return groups, (None if hbm is None else hbm * 2**30)
  user_preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  devices = jax.devices()
  platform = devices[0].platform
  if len(devices) == 1 and platform == "cpu":
    return None, None
  if jax.process_count() > 1:
    raise ValueError(_with_processes(cfg))
  groups = device_groups(cfg.workers, platform, len(devices))
  share = gpu_share(cfg.workers, len(devices)) if platform == "gpu" else 1
  device_mesh(cfg, scheme, devices[:max(len(devices) // cfg.workers, 1)])
  for environment in groups:  # the command line's choice, else jax's default
    environment["XLA_PYTHON_CLIENT_PREALLOCATE"] = (
        "true" if user_preallocate is None and share == 1 else user_preallocate or "false")
  # GPUs: each group has its devices' memory to itself (the state is checked
  # against one device's: a data-parallel layout holds it on each), or its
  # share of one GPU's. Host devices (the tests' stand-in) share the host's.
  own = platform != "cpu"
  return groups, (memory.training_memory() // share if own else None)


def check_before_connecting(cfg, num_processes: int | None) -> None:
  """The refusals of `worker_groups` that the flags alone decide: a
  ValueError where `--workers` meets `--num_processes` over 1, before
  `jax.distributed` connects (with `--coordinator_address=auto` the number
  of processes is known only once connected: `worker_groups` refuses it)."""
  if cfg.workers > 1 and (num_processes or 0) > 1:
    raise ValueError(_with_processes(cfg))


def _with_processes(cfg) -> str:
  """The refusal of `--workers` in a run of several processes."""
  return (f"`--workers` = {cfg.workers} with several processes (`--num_processes`): give "
          "one or the other.")


def distributed_started() -> bool:
  """Whether `jax.distributed` has been started in this process (asked
  without starting a backend)."""
  import jax  # pylint: disable=g-import-not-at-top
  started = getattr(jax.distributed, "is_initialized", None)
  return bool(started and started())


def backend_started() -> bool:
  """Whether this process has started a JAX backend (after which the
  platform it runs on can no longer be chosen)."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  started = getattr(xla_bridge, "backends_are_initialized", None)
  return bool(started and started())
