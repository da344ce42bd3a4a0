"""The attention-dimensionality ablation: arms x dims, seeds vmapped, and
optionally a grid over further config fields (`--sweep`).

This module plans: a `Plan` lists the workdirs to train (the sweep's, or one
per grid point) and hands out one `Job` per `config.Arm` of each; a job's
run folder is resumed, extended or skipped by the rules of `workdir` (which
also gives the workdir layout), trained here one after another or by
`workers` in parallel processes (each run by `training.train_lib`), and
reported by the `Report` function the driver hands in
(`attention_jax.analysis.reports.write`): reading results is a layer above
the sweep, which only says when a workdir's reports are due.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import time
from typing import Callable, Protocol, Sequence

import jax
import numpy as np

from attention_jax.sweep import config as config_lib
from attention_jax.sweep import datasets as datasets_lib
from attention_jax.sweep import shards as shards_lib
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.sweep import workdir_lock
from attention_jax.sweep import workers
from attention_jax.sweep.config import ExperimentConfig
from attention_jax import files
from attention_jax.training import interrupts
from attention_jax.training import memory
from attention_jax.training import multihost
from attention_jax.training import placement
from attention_jax.training import progress
from attention_jax.measure import provenance
from attention_jax.training import run_folder
from attention_jax.training import train_lib


class Report(Protocol):
  """Writes the reports of a workdir from its finished runs and returns its
  table: `report(workdir, cfg)` those of one workdir (the sweep's, or a grid
  point's), `report(workdir, cfg, grid)` the pivoted ones of a `--sweep`
  grid. The sweep calls it after every finished run and at the end. A run
  whose files it cannot read it leaves out, and raises
  `workdir.UnreadableRuns` naming it once the rest is written; the sweep
  names that run and goes on (`Plan.report`)."""

  def __call__(self, workdir: workdir_lib.Workdir, cfg: ExperimentConfig,
               grid: Sequence[config_lib.GridPoint] | None = None) -> str: ...


@dataclasses.dataclass(frozen=True)
class Point:
  """A workdir the sweep trains: one grid point (`name` its folder), or the
  sweep itself without a grid (`name` None)."""
  config: ExperimentConfig
  workdir: workdir_lib.Workdir
  name: str | None = None

  def jobs(self) -> tuple[Job, ...]:
    return tuple(Job(self, arm) for arm in self.config.sweep())


@dataclasses.dataclass(frozen=True)
class Job:
  """One run the sweep hands out: an arm of a point."""
  point: Point
  arm: config_lib.Arm

  @property
  def config(self) -> ExperimentConfig:
    return self.point.config

  @property
  def run(self) -> run_folder.RunDir:
    return self.point.workdir.run(self.arm)

  @property
  def label(self) -> str:
    """How logs name it: the arm, after the grid point's name in a grid."""
    return self.arm.label if self.point.name is None else f"{self.point.name} {self.arm.label}"


@dataclasses.dataclass(frozen=True)
class Plan:
  """The workdirs of a sweep: `config` in `workdir`, or with `grid` one
  workdir per `config.GridPoint` inside it; `report_fn` writes their reports
  (None: a plan that only lists its jobs)."""
  config: ExperimentConfig
  workdir: workdir_lib.Workdir
  grid: tuple[config_lib.GridPoint, ...] | None = None
  report_fn: Report | None = None

  @classmethod
  def of(cls, cfg: ExperimentConfig, workdir: str,
         axes: tuple[tuple[str, tuple], ...] = (), report: Report | None = None) -> Plan:
    return cls(cfg, workdir_lib.Workdir(workdir), config_lib.grid(cfg, axes) if axes else None,
               report)

  @property
  def points(self) -> tuple[Point, ...]:
    if self.grid is None:
      return (Point(self.config, self.workdir),)
    return tuple(Point(p.config, self.workdir.point(p), p.name) for p in self.grid)

  def jobs(self) -> tuple[Job, ...]:
    return tuple(job for point in self.points for job in point.jobs())

  @contextlib.contextmanager
  def locks(self, log=print, existing_only: bool = False, shared: bool = False):
    """Holds the locks of the workdir and of every grid point's (those that
    exist, with `existing_only`): one driver per workdir, or with `shared`
    any number of shard drivers (`--shard`) and no other. A lock refused
    releases those taken before it."""
    folders = [self.workdir] + ([p.workdir for p in self.points] if self.grid else [])
    with contextlib.ExitStack() as stack:
      for workdir in folders:
        if workdir.exists or not existing_only:
          stack.enter_context(workdir_lock.WorkdirLock(workdir.path, log=log, shared=shared))
      yield

  def reporting(self):
    """The lock under which a shard driver writes the reports, waited for:
    one writer at a time, so that the last to write has read every run."""
    return workdir_lock.WorkdirLock(self.workdir.path, wait=True,
                                    name=workdir_lock.REPORT_LOCK_NAME)

  def label_of(self, path: str) -> str:
    """How logs name the run in the folder `path`: its job's label, else the
    folder relative to the workdir."""
    labels = {job.run.path: job.label for job in self.jobs()}
    return labels.get(path, os.path.relpath(path, self.workdir.path))

  def _report(self, problems: dict[str, str], log: Callable[[str], None], *args) -> str:
    """`report_fn(*args)`, whose runs that could not be read
    (`workdir.UnreadableRuns`) are added to `problems` (run folder -> why),
    each named in one line through `log` as it is first found; the table."""
    try:
      return self.report_fn(*args)
    except workdir_lib.UnreadableRuns as e:
      for path, why in e.problems.items():
        if path not in problems:
          problems[path] = why
          log(f"[{self.label_of(path)}] left out of the reports, the other runs go on: {why}")
      return e.table

  def report(self, point: Point, problems: dict[str, str],
             log: Callable[[str], None] = print) -> None:
    """The reports after one of `point`'s runs finished: its own, and the
    grid's; the runs they had to leave out are added to `problems`."""
    self._report(problems, log, point.workdir, point.config)
    if self.grid is not None:
      self._report(problems, log, self.workdir, self.config, self.grid)

  def report_all(self, problems: dict[str, str], existing_only: bool = False,
                 log: Callable[[str], None] = print) -> str:
    """Every report; returns the sweep's table (the grid's with a grid). The
    runs they had to leave out are added to `problems`."""
    tables = [self._report(problems, log, p.workdir, p.config) for p in self.points
              if p.workdir.exists or not existing_only]
    if self.grid is not None:
      return self._report(problems, log, self.workdir, self.config, self.grid)
    return tables[0]


def run(cfg: ExperimentConfig, workdir: str, *, report: Report, mesh=None,
        log: Callable[[str], None] = print,
        data=None, axes: tuple[tuple[str, tuple], ...] = (),
        worker_environments: Sequence[dict] | None = None,
        mesh_scheme: str = "auto", group_memory: int | None = None,
        shard: tuple[int, int] | None = None) -> str | None:
  """Runs (or resumes) the whole sweep, writing its reports with `report`
  after every finished run; returns the table, or None if stopped early.

  `axes` (`config.parse_axis` results) make it a grid: one workdir per point
  under `workdir` (`workdir.Workdir.point`). With `cfg.workers > 1` the unfinished
  (point, arm, dim) runs are trained that many at a time, each in its own
  process on one core (largest dimension first, so the longest runs
  start first); otherwise one after another here. With
  `worker_environments` (`workers.device_groups`: a host's devices split
  between the workers), every run is trained in a worker on its group of
  devices, its members laid out on them as `mesh_scheme` says (`mesh`,
  which spans every device, is then not used). A run whose parameters
  and optimiser state alone cannot fit in memory is refused before the
  workdir is made (`memory.check_memory`): in the memory the `--workers`
  share, or, given `group_memory`, in the bytes each worker's group of
  devices has to itself (a GPU's, a TPU chip's).

  `shard` (index, count): this driver's share of the runs (`shards.share`),
  beside any number of other shard drivers on the workdir (`_run_shard`).
  """
  plan = Plan.of(cfg, workdir, axes, report)
  # The memory is shared by the runs that train at once, never more than the
  # sweep has, whatever `--workers` says (`memory.check_memory`, evaluation budgets).
  cfg = cfg.replace(workers=min(cfg.workers, len(plan.jobs())))
  plan = Plan.of(cfg, workdir, axes, report)
  check_workdir(plan)  # before anything is made
  for job in plan.jobs():  # before the data is loaded: thousands of members
    memory.check_members(job.config.point(job.arm), placement.axis_size(mesh, placement.MEMBERS))
  data_sets = datasets_lib.Datasets()
  if data is not None:
    data_sets.put(cfg, data)
  for job in plan.jobs():  # before anything is made
    memory.check_memory(job.config.point(job.arm), data_sets.get(job.config),
                        available=group_memory, shared=group_memory is None)
  provenance.fields()  # the commit as the run starts, not as it ends hours later
  os.makedirs(workdir, exist_ok=True)
  if not multihost.is_primary():  # the primary holds the locks and writes every file
    _run_locked(plan, mesh=mesh, log=log, data_sets=data_sets,
                groups=worker_environments, scheme=mesh_scheme)
    log(f"process {jax.process_index()} of {jax.process_count()}: done; process 0 "
        "writes the results")
    return None
  if shard is not None:
    if jax.process_count() > 1:
      raise ValueError("`--shard` shares a sweep among independent drivers, not among the "
                       "processes of one run.")
    with plan.locks(log=log, shared=True):  # shard drivers only
      return _run_shard(plan, shard, mesh=mesh, log=log, data_sets=data_sets,
                        groups=worker_environments, scheme=mesh_scheme)
  with plan.locks(log=log):  # one driver per workdir, and per grid point
    return _run_locked(plan, mesh=mesh, log=log, data_sets=data_sets,
                       groups=worker_environments, scheme=mesh_scheme)


def check_workdir(plan: Plan) -> None:
  """Refuses, in one line and before any work, a plan whose workdir holds
  runs of another configuration or layout (`workdir.check_configuration`),
  or one of whose runs it would train again from step 1, cutting a metrics
  log that no checkpoint holds any longer (`workdir.check_retraining`)."""
  workdir_lib.check_configuration(plan.workdir, plan.config, plan.grid)
  for job in plan.jobs():
    workdir_lib.check_retraining(job.run, workdir_lib.fingerprint(job.config, job.arm))


def report_only(cfg: ExperimentConfig, workdir: str,
                axes: tuple[tuple[str, tuple], ...] = (), *, report: Report) -> str:
  """Rewrites every report of `workdir` from its finished runs and trains
  nothing (a partial grid's table shows '–' where a run is missing). A
  workdir of another layout or configuration than the flags give is refused
  before anything is written (`workdir.check_configuration`: a grid's
  reports rewritten without its `--sweep` were emptied); a run whose files
  do not read is left out, and `workdir.UnreadableRuns` names it once the
  others' reports are written."""
  if not os.path.isdir(workdir):
    raise ValueError(f"`--workdir` {workdir} does not exist: nothing to report.")
  plan = Plan.of(cfg, workdir, axes, report)
  workdir_lib.check_configuration(plan.workdir, plan.config, plan.grid)
  with plan.locks(existing_only=True):
    for job in plan.jobs():
      old_steps = workdir_lib.check_run(job.run, workdir_lib.fingerprint(job.config, job.arm),
                                        write=False)
      if old_steps is not None:
        raise ValueError(f"{job.run.path} holds a run of {old_steps} steps, not "
                         f"{job.config.steps}: drop --report_only to extend it, or ask "
                         f"for --steps={old_steps}.")
    problems = {}
    table = plan.report_all(problems, existing_only=True, log=lambda line: None)
    if problems:  # each named in the error (rather than also in a line of its own)
      raise workdir_lib.UnreadableRuns(table, problems)
    return table


def _prepare(job: Job, log: Callable[[str], None]) -> bool:
  """Makes `job`'s run folder (refusing one made with other settings) and
  extends a shorter run there; whether the job is still to train."""
  run_dir = job.run
  os.makedirs(run_dir.path, exist_ok=True)
  fp = workdir_lib.fingerprint(job.config, job.arm)
  logged = workdir_lib.check_retraining(run_dir, fp)
  if logged:
    log(f"[{job.label}] no checkpoint: training starts again from step 1 (its metrics log, "
        f"up to step {logged}, is rewritten)")
  old_steps = workdir_lib.check_run(run_dir, fp)
  # Every process has read the folder before the primary changes it.
  if multihost.agree(old_steps is not None):
    if multihost.is_primary():
      workdir_lib.extend_run(run_dir, fp, old_steps)
    multihost.sync(f"extend {run_dir.path}")
    log(f"[{job.label}] extended from {old_steps} to {fp['steps']} steps")
  if run_dir.finished:
    log(f"[{job.label}] finished earlier; skipped")
    return False
  return True


def _run_locked(plan: Plan, *, mesh, log, data_sets: datasets_lib.Datasets,
                groups: Sequence[dict] | None = None, scheme: str = "auto") -> str | None:
  cfg = plan.config
  primary = multihost.is_primary()
  check_workdir(plan)  # again, under the locks: another driver may have trained there since
  for path in files.remove_stale_temporaries(plan.workdir.path) if primary else ():
    log(f"removed {path}, left by an interrupted write")
  deadline = time.time() + 60 * cfg.max_minutes if cfg.max_minutes else None
  problems = {}  # runs the reports left out (`Plan.report`), by folder
  failures = []  # "[label] why" of the runs whose training failed
  pending = [job for job in plan.jobs() if _prepare(job, log)]
  if pending and (groups is not None or (cfg.workers > 1 and len(pending) > 1)):
    if groups is None and mesh is not None:
      raise ValueError(f"`workers` = {cfg.workers} trains pairs in separate single-device "
                       "processes; it cannot be combined with a mesh of several devices.")
    finished, failures = _in_workers(cfg, pending, groups, scheme, deadline,
                                     lambda job: plan.report(job.point, problems, log), log)
  else:
    finished = True
    sweep = progress.SweepProgress(len(pending))  # the whole sweep's ETA on each line
    for job in pending:
      sweep.start_run()
      _stop_if_asked(job, log)
      if not train_group(job.config, job.run, job.arm, data_sets.get(job.config), mesh=mesh,
                         log=log, deadline=deadline, label=job.label, sweep=sweep):
        finished = False
        break
      if primary:
        plan.report(job.point, problems, log)
  if not finished:
    log("time budget reached; re-run the same command to continue")
    return None
  if not primary:
    return None
  # Where no run finished (every one failed) there is no report to write: an
  # empty results.jsonl would read as a sweep of no runs.
  table = (plan.report_all(problems, log=log) if any(job.run.finished for job in plan.jobs())
           else None)
  failures = failures + [f"[{plan.label_of(path)}] {why}" for path, why in problems.items()]
  if failures:
    raise workers.RunsFailed(failures, len(plan.jobs()))
  return table


def _stop_if_asked(job: Job, log: Callable[[str], None]) -> None:
  """Between two runs (nothing under way to save): where a stop was asked
  for, in any process, says so and raises `interrupts.Interrupted`."""
  if multihost.anywhere(interrupts.requested() is not None):
    signum = interrupts.requested() or signal.SIGTERM
    log(f"{signal.Signals(signum).name}: stopped before [{job.label}]; finished runs are "
        "kept, re-run the same command to continue")
    raise interrupts.Interrupted(signum)


def _in_workers(cfg: ExperimentConfig, pending: list[Job], groups: Sequence[dict] | None,
                scheme: str, deadline: float | None, report: Callable[[Job], object],
                log: Callable[[str], None]) -> tuple[bool, list[str]]:
  """Trains `pending` in `--workers` processes (the largest dimension first,
  so the longest runs start first; on `groups` of devices where given), each
  reported by `report` as it finishes: (False where the time budget stopped
  them, the "[label] why" of the runs that failed; the others finished)."""
  pending = sorted(pending, key=lambda job: -job.arm.attention_dim)
  train = train_job if groups is None else functools.partial(train_job, mesh_scheme=scheme)
  try:
    return workers.run_in_workers(max(1, min(cfg.workers, len(pending))), pending, train,
                                  deadline, report, log=log, environments=groups), []
  except workers.RunsFailed as e:  # the others finished: reported by the caller, with these
    return True, e.failures


def _take(job: Job, log: Callable[[str], None]) -> workdir_lock.WorkdirLock | None:
  """The lock of `job`'s run, taken; None (said in one line) where another
  live driver trains it. A lock left by a dead driver is taken over."""
  try:
    return workdir_lock.WorkdirLock(job.run.path, log=log, what="run").acquire()
  except workdir_lock.RunBusyError as e:
    log(f"[{job.label}] {e}: left to it")
    return None


def _run_shard(plan: Plan, shard: tuple[int, int], *, mesh, log,
               data_sets: datasets_lib.Datasets, groups: Sequence[dict] | None = None,
               scheme: str = "auto") -> str | None:
  """Trains this driver's share of the runs (`shards.share`), each under its
  own lock (`_take`: a run another driver holds is left to it), then, one at
  a time, any run of the sweep still unfinished and free (work stealing: a
  shard that ends early helps the others); writes the reports after each run
  under `Plan.reporting`. With `--workers` its share is locked up front and
  trained by the pool, and nothing is stolen. Returns the table as this
  driver last wrote it (complete once the last driver ends); None if the
  time budget stopped it."""
  cfg = plan.config
  index, count = shard
  check_workdir(plan)  # under the shared locks: no driver of the whole sweep can start now
  deadline = time.time() + 60 * cfg.max_minutes if cfg.max_minutes else None
  problems, failures = {}, []
  jobs = plan.jobs()
  mine = shards_lib.share(jobs, shard)
  log(f"shard {index}/{count}: {len(mine)} of the sweep's {len(jobs)} runs"
      + (f" ({', '.join(job.label for job in mine)})" if mine else ""))

  def report(job):
    with plan.reporting():
      plan.report(job.point, problems, log)

  trained = 0
  if mine and (groups is not None or cfg.workers > 1):
    held, pending = [], []
    try:
      for job in mine:
        lock = _take(job, log)
        if lock is not None:
          held.append(lock)
          if _prepare(job, log):
            pending.append(job)
      if pending:
        finished, failures = _in_workers(cfg, pending, groups, scheme, deadline, report, log)
        if not finished:
          log("time budget reached; re-run the same command to continue")
          return None
        trained = len(pending)
    finally:
      for lock in held:
        lock.release()
  else:
    others = [job for job in jobs if job not in mine]
    # The ETA of this driver's own share (runs it may steal are not foreseen).
    sweep = progress.SweepProgress(sum(not job.run.finished for job in mine))
    for job in list(mine) + others:
      if job not in mine and job.run.finished:
        continue  # another shard's, done: nothing to say
      _stop_if_asked(job, log)
      lock = _take(job, log)
      if lock is None:
        continue
      try:
        if not _prepare(job, log):
          continue
        if job not in mine:
          log(f"[{job.label}] shard {index}/{count}: another shard's run, free: trained here")
        sweep.start_run()
        if not train_group(job.config, job.run, job.arm, data_sets.get(job.config), mesh=mesh,
                           log=log, deadline=deadline, label=job.label, sweep=sweep):
          log("time budget reached; re-run the same command to continue")
          return None
        trained += 1
      finally:
        lock.release()
      report(job)
  with plan.reporting():
    table = plan.report_all(problems, log=log)
  left = [job.label for job in jobs if not job.run.finished]
  log(f"shard {index}/{count}: {trained} runs trained here; "
      + (f"{len(left)} of {len(jobs)} runs still with other drivers "
         f"({', '.join(left)}): the last to finish writes the whole table" if left else
         f"all {len(jobs)} runs of the sweep are finished"))
  failures = failures + [f"[{plan.label_of(path)}] {why}" for path, why in problems.items()]
  if failures:
    # Finished: trained to the end and not among the failures (a run of
    # another shard still training is neither).
    named = {f.partition("]")[0] + "]" for f in failures}
    raise workers.RunsFailed(failures, len(jobs), finished=sum(
        job.run.finished and f"[{job.label}]" not in named for job in jobs))
  return table


# A `--workers` process's datasets: one at a time.
_WORKER_DATASETS = datasets_lib.Datasets(limit=1)


def train_job(job: Job, *, log: Callable[[str], None], deadline: float | None,
              mesh_scheme: str | None = None) -> bool:
  """`train_group` of `job` in a `--workers` process, which loads each
  dataset once (`_WORKER_DATASETS`); with `mesh_scheme`, its members laid
  out on the worker's own devices (`workers.device_mesh`)."""
  mesh = None if mesh_scheme is None else workers.device_mesh(job.config, mesh_scheme)
  return train_group(job.config, job.run, job.arm, _WORKER_DATASETS.get(job.config),
                     mesh=mesh, log=log, deadline=deadline, label=job.label)


def train_group(cfg: ExperimentConfig, run_dir: run_folder.RunDir, arm: config_lib.Arm, data,
                *, mesh=None, log: Callable[[str], None] = print,
                deadline: float | None = None, label: str | None = None,
                sweep: progress.SweepProgress | None = None) -> bool:
  """Trains (or resumes) one sweep point in `run_dir` and writes its results;
  False if `deadline` stopped it first (its checkpoint is saved). `sweep`:
  the sweep it is one of, for the whole-sweep ETA on its progress lines."""
  if deadline is not None and multihost.agree(time.time() > deadline):
    return False
  # Until its first step a stop ends the process at once (there is nothing
  # to save); not with several processes, which stop at one step together.
  unsaved = (interrupts.nothing_to_save(f"[{label or arm.label}]") if jax.process_count() == 1
             else contextlib.nullcontext())
  with unsaved:
    trainer = train_lib.EnsembleTrainer(cfg.point(arm), data, tuple(range(cfg.seeds)),
                                        mesh=mesh, label=label)
    members = (f", members {cfg.members} x seeds {list(range(cfg.seeds))}" if cfg.members
               else f", seeds {list(trainer.seeds)}")
    log(f"[{trainer.label}] {trainer.num_params:,} parameters{members}")
    result = trainer.run(run_dir.path, log=log, deadline=deadline, sweep=sweep)
  if result is None:
    return False
  if not multihost.is_primary():
    return True
  if result.attention is not None:
    att = {k: (np.asarray(v).tolist() if k == "weights" else v)
           for k, v in result.attention.items()}
    files.atomic_write(run_dir.attention, files.to_json(att))
  files.atomic_write(run_dir.translations,
                           files.to_json(result.translations, ensure_ascii=False))
  # Written last: its presence marks the pair finished. Each row says which
  # code, versions, device and command made it (not part of the fingerprint).
  files.atomic_write(run_dir.result,
                           files.to_json(list(map(provenance.stamp, result.rows)),
                                               indent=1))
  return True
