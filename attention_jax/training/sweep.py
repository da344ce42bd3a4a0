"""The attention-dimensionality ablation: arms x dims, seeds vmapped, and
optionally a grid over further config fields (`--sweep`).

Workdir layout (everything written atomically; a re-run resumes):

  runs/<arm>_d<dim>/config.json     settings the run was made with
  runs/<arm>_d<dim>/checkpoints/    Orbax checkpoints (latest two)
  runs/<arm>_d<dim>/metrics.jsonl   loss, softmax diagnostics, validation BLEU
  runs/<arm>_d<dim>/attention.json  alignment of test sentence 0 (seed 0)
  runs/<arm>_d<dim>/test_translations.json  final test outputs per seed (for significance)
  runs/<arm>_d<dim>/significance.json       cached paired test against the baseline arm
  runs/<arm>_d<dim>/result.json     one row per seed; its presence = finished
  runs/<arm>_d<dim>/result.steps<N>.json  the result of N steps, kept when a
                                    larger --steps extended the run (`_extend`)
  .lock                             PID, host and start of the driver using the workdir
  results.jsonl, table.md, ablation.png, validation.png, diagnostics.png,
  attention_<arm>_<dim>.png

With `axes` (e.g. `--sweep=learning_rate=3e-4,1e-3`) every grid point is a
workdir of the layout above in `<workdir>/<field>=<value>[,<field>=<value>]/`
(`config.GridPoint.name`), resumed and skipped per point, and the workdir
itself holds the pivoted reports of the whole grid:

  .lock, results.jsonl (every row with its swept values), table.md (arms
  against the first axis, one table per dim and value of any further axis),
  sweep_<axis>.png, max_logit.png
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from typing import Callable

import jax
import numpy as np

from attention_jax.data import input_pipeline
from attention_jax.training import checkpoints
from attention_jax.training import config as config_lib
from attention_jax.training import interrupts
from attention_jax.training import memory
from attention_jax.training import metrics_log
from attention_jax.training import multihost
from attention_jax.training import provenance
from attention_jax.training import reporting
from attention_jax.training import significance as significance_lib
from attention_jax.training import train_lib
from attention_jax.training import workdir_lock
from attention_jax.training.config import ExperimentConfig


# Fields that may differ between a run and its resumption without changing
# its numbers.
# Fields that do not change a run's numbers: a run resumes under other values.
# (The evaluation batch only groups sentences; it is chosen to fit in memory.)
RESUMABLE_FIELDS = ("arms", "dims", "max_minutes", "log_every", "workers", "eval_batch_size",
                    "eval_memory_gb", "additive_max_dim", "baseline")
TRANSLATIONS = "test_translations.json"


def group_dir(workdir: str, arm: str, dim: int) -> str:
  return os.path.join(workdir, "runs", f"{arm}_d{dim}")


def fingerprint(cfg: ExperimentConfig, arm: str, dim: int) -> dict:
  """The settings that determine a run's numbers."""
  d = {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_FIELDS}
  d = json.loads(json.dumps(d))  # tuples -> lists, as they come back from JSON
  d.update(arm=arm, dim=dim)
  return d


def load_data(cfg: ExperimentConfig):
  kwargs = dict(max_length=cfg.max_length)
  if cfg.data_dir:
    kwargs["data_dir"] = cfg.data_dir
  if not cfg.dataset.startswith(("copy", "reverse", "sort")):
    kwargs["vocab_size"] = cfg.vocab_size
  return input_pipeline.load(cfg.dataset, **kwargs)


def finished_rows(workdir: str, cfg: ExperimentConfig) -> list[dict]:
  rows = []
  for arm in cfg.arms:
    for dim in cfg.dims:
      path = os.path.join(group_dir(workdir, arm, dim), "result.json")
      if os.path.exists(path):
        rows.extend(checkpoints.read_json(
            path, list, "delete it and re-run the same command to evaluate that run again "
            "from its last checkpoint"))
  return rows


def baseline_arm(cfg: ExperimentConfig) -> str:
  """The arm the others are tested against: `cfg.baseline`, else additive
  when swept, else the first."""
  if cfg.baseline:
    return cfg.baseline
  return "additive" if "additive" in cfg.arms else cfg.arms[0]


def significance(workdir: str, cfg: ExperimentConfig) -> dict[tuple[str, int], dict]:
  """Seed-paired AR tests (`significance.compare_runs`) of every finished arm
  against the baseline arm at the same dimension, cached per pair in
  `significance.json` under the digest of both runs' translations and the
  result's `significance.FORMAT`."""
  base = baseline_arm(cfg)
  out = {}
  for dim in cfg.dims:
    base_path = os.path.join(group_dir(workdir, base, dim), TRANSLATIONS)
    if not os.path.exists(base_path):
      continue
    for arm in cfg.arms:
      run_dir = group_dir(workdir, arm, dim)
      path = os.path.join(run_dir, TRANSLATIONS)
      if arm == base or not os.path.exists(path):
        continue
      with open(base_path, "rb") as f:
        base_bytes = f.read()
      with open(path, "rb") as f:
        own_bytes = f.read()
      digest = hashlib.sha256(base_bytes + b"\0" + own_bytes).hexdigest()
      cache_path = os.path.join(run_dir, "significance.json")
      cached = None
      if os.path.exists(cache_path):
        try:
          cached = checkpoints.read_json(cache_path, dict)
        except ValueError:  # cut by a kill, or damaged: recomputed
          cached = None
      if (cached is not None and cached.get("digest") == digest
          and cached.get("format", 1) == significance_lib.FORMAT):
        out[(arm, dim)] = cached["result"]
        continue
      remedy = ("delete it and that run's result.json, and re-run the same command to "
                "evaluate the run again")
      result = significance_lib.compare_runs(
          checkpoints.read_json(base_path, dict, remedy),
          checkpoints.read_json(path, dict, remedy))
      checkpoints.atomic_write(cache_path, checkpoints.to_json(
          {"baseline": base, "digest": digest, "format": significance_lib.FORMAT,
           "result": result}))
      out[(arm, dim)] = result
  return out


def write_reports(workdir: str, cfg: ExperimentConfig) -> str:
  """Regenerates results.jsonl, table.md and the plots from the finished runs."""
  rows = finished_rows(workdir, cfg)
  reporting.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)
  settings = (f"model={cfg.model}, dataset={cfg.dataset}, steps={cfg.steps}, "
              f"{cfg.seeds} seeds")
  test_set = f"first {cfg.test_examples} test sentences" if cfg.test_examples else "test split"
  parts = [
      f"Test BLEU (sacrebleu, beam {cfg.beam_size}, {test_set}), mean ± std (max) over "
      f"seeds; {settings}.\n\n" + reporting.britz_table(rows, cfg.arms, cfg.dims)]
  if any("val_ppl" in r for r in rows):
    parts.append(
        "Validation perplexity (teacher-forced, per target token, whole validation split; "
        "parameters of the best validation BLEU), mean ± std (min) over seeds.\n\n"
        + reporting.britz_table(rows, cfg.arms, cfg.dims, metric="val_ppl", best=min))
  tests = significance(workdir, cfg)
  if tests:
    parts.append(
        f"Test BLEU difference to {baseline_arm(cfg)} at the same dimension, mean over "
        "seed pairs, with the largest p over the pairs (paired approximate randomisation "
        f"over test sentences, {significance_lib.TRIALS:,} trials, sacrebleu).\n\n"
        + reporting.significance_table(tests, cfg.arms, cfg.dims, baseline_arm(cfg)))
  text = "\n".join(parts)
  checkpoints.atomic_write(os.path.join(workdir, "table.md"), text)
  if rows:
    reporting.plot_ablation(rows, cfg.arms, os.path.join(workdir, "ablation.png"))
  histories = {}
  for arm in cfg.arms:
    for dim in cfg.dims:
      run_dir = group_dir(workdir, arm, dim)
      log = metrics_log.MetricsLog(os.path.join(run_dir, "metrics.jsonl")).read()
      if log:
        histories[(arm, dim)] = log
      att_path = os.path.join(run_dir, "attention.json")
      if os.path.exists(att_path) and os.path.exists(os.path.join(run_dir, "result.json")):
        attention = checkpoints.read_json(
            att_path, dict, "delete it (the run's heat map is then left out)")
        reporting.plot_attention(attention, f"{arm}, a={dim}, seed 0",
                                 os.path.join(workdir, f"attention_{arm}_{dim}.png"))
  if histories:
    reporting.plot_diagnostics(histories, cfg.arms, os.path.join(workdir, "diagnostics.png"))
    reporting.plot_validation(histories, cfg.arms, os.path.join(workdir, "validation.png"))
  return text


def _final_max_logit(row: dict) -> dict:
  """The row with its end-of-training max attention logit at the top level."""
  return {**row, "max_logit": (row.get("diagnostics") or {}).get("max_logit")}


def _slices(cfg: ExperimentConfig, points: tuple[config_lib.GridPoint, ...], axis: str):
  """(fixed values of the further axes, dim, caption) of every table of a
  grid report: one table per dim and value of every further axis, arms
  against `axis`."""
  first = points[0].values[axis]
  for p in points:
    if p.values[axis] != first:
      continue
    fixed = {k: v for k, v in p.values.items() if k != axis}
    for dim in cfg.dims:
      yield fixed, dim, ", ".join([f"a = {dim}"] + [f"{k} = {v}" for k, v in fixed.items()])


def write_grid_reports(workdir: str, cfg: ExperimentConfig,
                       points: tuple[config_lib.GridPoint, ...]) -> str:
  """The reports of a `--sweep` grid from the finished runs of every point:
  results.jsonl (each row with the point's swept values), table.md (arms
  against the first axis), sweep_<axis>.png and max_logit.png."""
  axis = next(iter(points[0].values))
  axis_values = tuple(dict.fromkeys(p.values[axis] for p in points))
  rows, tests, histories = [], {}, {}
  for p in points:
    folder = point_dir(workdir, p)
    point_rows = [_final_max_logit({**r, **p.values}) for r in finished_rows(folder, p.config)]
    rows.extend(point_rows)
    if point_rows:
      for (arm, dim), result in significance(folder, p.config).items():
        tests[(p.name, arm, dim)] = result
    for arm in cfg.arms:
      for dim in cfg.dims:
        log = metrics_log.MetricsLog(os.path.join(group_dir(folder, arm, dim), "metrics.jsonl"),
                                     write=False).read()
        if log:
          histories.setdefault(p.name, {})[(arm, dim)] = log
  reporting.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)

  base = baseline_arm(cfg)
  test_set = f"first {cfg.test_examples} test sentences" if cfg.test_examples else "test split"
  beam = "swept" if {"beam_size", "test_examples"} & set(points[0].values) else (
      f"beam {cfg.beam_size}, {test_set}")
  sections = [
      ("test_bleu", max, f"Test BLEU (sacrebleu, {beam}), "
                         "mean ± std (max) over seeds"),
      ("val_ppl", min, "Validation perplexity (teacher-forced, per target token, whole "
                       "validation split; parameters of the best validation BLEU), "
                       "mean ± std (min) over seeds"),
      ("max_logit", max, "Largest attention logit at the end of training (validation "
                         "batch; raw score before the softmax), mean ± std (max) over seeds"),
  ]
  swept = set(points[0].values)
  fixed_settings = ", ".join(f"{k}={getattr(cfg, k)}" for k in ("model", "dataset", "steps",
                                                                "seeds") if k not in swept)
  parts = [f"Grid over {', '.join(f'`{k}`' for k in points[0].values)}; tables by "
           f"`{axis}` = {', '.join(map(str, axis_values))}; {fixed_settings} (every other "
           "setting as in each point's config.json).\n"]
  for metric, best, caption in sections:
    parts.append(f"## {caption}\n")
    for fixed, dim, where in _slices(cfg, points, axis):
      subset = [{**r, "dim": r[axis]} for r in rows if r["dim"] == dim
                and all(r.get(k) == v for k, v in fixed.items())]
      parts.append(f"{where}:\n\n" + reporting.britz_table(
          subset, cfg.arms, axis_values, metric=metric, best=best, params=False,
          row_label=axis))
  if tests:
    parts.append(f"## Test BLEU difference to {base} at the same dimension and {axis}, mean "
                 "over seed pairs, with the largest p over the pairs (paired approximate "
                 f"randomisation over test sentences, {significance_lib.TRIALS:,} trials)\n")
    for fixed, dim, where in _slices(cfg, points, axis):
      keyed = {}
      for p in points:
        if all(p.values[k] == v for k, v in fixed.items()):
          for arm in cfg.arms:
            if (p.name, arm, dim) in tests:
              keyed[(arm, p.values[axis])] = tests[(p.name, arm, dim)]
      parts.append(f"{where}:\n\n" + reporting.significance_table(
          keyed, cfg.arms, axis_values, base, row_label=axis))
  text = "\n".join(parts)
  checkpoints.atomic_write(os.path.join(workdir, "table.md"), text)
  if rows:
    reporting.plot_sweep(rows, cfg.arms, axis, os.path.join(workdir, f"sweep_{axis}.png"))
  if histories:
    reporting.plot_history_panels(histories, cfg.arms, "max_logit",
                                  "largest attention logit", os.path.join(workdir, "max_logit.png"))
  return text


def run(cfg: ExperimentConfig, workdir: str, *, mesh=None,
        log: Callable[[str], None] = print,
        data=None, axes: tuple[tuple[str, tuple], ...] = ()) -> str | None:
  """Runs (or resumes) the whole sweep; returns the table, or None if stopped early.

  `axes` (`config.parse_axis` results) make it a grid: one workdir per point
  under `workdir` (module docstring). With `cfg.workers > 1` the unfinished
  (point, arm, dim) runs are trained that many at a time, each in its own
  single-threaded process (largest dimension first, so the longest runs
  start first); otherwise one after another here. A run whose parameters
  and optimiser state alone cannot fit in memory is refused before the
  workdir is made (`memory.check_memory`).
  """
  points = config_lib.grid(cfg, axes) if axes else None
  loaded = {} if data is None else {_data_key(cfg): data}
  for point_cfg, _ in _targets(cfg, workdir, points):  # before anything is made
    for arm in point_cfg.sweep():
      memory.check_memory(point_cfg.point(arm), _data(point_cfg, loaded))
  provenance.fields()  # the commit as the run starts, not as it ends hours later
  os.makedirs(workdir, exist_ok=True)
  if not multihost.is_primary():  # the primary holds the locks and writes every file
    _run_locked(cfg, workdir, points, mesh=mesh, log=log, loaded=loaded)
    log(f"process {jax.process_index()} of {jax.process_count()}: done; process 0 "
        "writes the results")
    return None
  with contextlib.ExitStack() as locks:  # one driver per workdir, and per grid point
    for folder in [workdir] + [point_dir(workdir, p) for p in points or ()]:
      locks.enter_context(workdir_lock.WorkdirLock(folder, log=log))
    return _run_locked(cfg, workdir, points, mesh=mesh, log=log, loaded=loaded)


def report_only(cfg: ExperimentConfig, workdir: str,
                axes: tuple[tuple[str, tuple], ...] = ()) -> str:
  """Rewrites every report of `workdir` from its finished runs and trains
  nothing (a partial grid's table shows '–' where a run is missing)."""
  if not os.path.isdir(workdir):
    raise ValueError(f"`--workdir` {workdir} does not exist: nothing to report.")
  points = config_lib.grid(cfg, axes) if axes else None
  targets = _targets(cfg, workdir, points)
  with contextlib.ExitStack() as locks:
    for folder in [workdir] + [point_dir(workdir, p) for p in points or ()]:
      if os.path.isdir(folder):
        locks.enter_context(workdir_lock.WorkdirLock(folder))
    for point_cfg, _, arm, run_dir in _runs(targets):
      old_steps = _check(run_dir, fingerprint(point_cfg, arm.name, arm.attention_dim),
                         write=False)
      if old_steps is not None:
        raise ValueError(f"{run_dir} holds a run of {old_steps} steps, not "
                         f"{point_cfg.steps}: drop --report_only to extend it, or ask "
                         f"for --steps={old_steps}.")
    tables = [write_reports(folder, point_cfg)
              for point_cfg, folder in targets if os.path.isdir(folder)]
    if points is not None:
      return write_grid_reports(workdir, cfg, points)
    return tables[0]


def point_dir(workdir: str, point: config_lib.GridPoint) -> str:
  return os.path.join(workdir, point.name)


def _targets(cfg, workdir, points):
  """(config, workdir) of every grid point; the sweep itself without a grid."""
  if points is None:
    return [(cfg, workdir)]
  return [(p.config, point_dir(workdir, p)) for p in points]


def _runs(targets):
  """(config, workdir, arm, run folder) of every run of `_targets`."""
  for point_cfg, folder in targets:
    for arm in point_cfg.sweep():
      yield point_cfg, folder, arm, group_dir(folder, arm.name, arm.attention_dim)


def _data_key(cfg: ExperimentConfig):
  return (cfg.dataset, cfg.data_dir, cfg.vocab_size, cfg.max_length)


def _data(cfg: ExperimentConfig, loaded: dict):
  """The dataset of `cfg`, loaded once into `loaded` (keyed by `_data_key`)."""
  key = _data_key(cfg)
  if key not in loaded:
    loaded[key] = load_data(cfg)
  return loaded[key]


def _run_locked(cfg, workdir, points, *, mesh, log, loaded: dict) -> str | None:
  primary = multihost.is_primary()
  for path in checkpoints.remove_stale_temporaries(workdir) if primary else ():
    log(f"removed {path}, left by an interrupted write")
  deadline = time.time() + 60 * cfg.max_minutes if cfg.max_minutes else None
  targets = _targets(cfg, workdir, points)
  pending = []
  for point_cfg, folder, arm, run_dir in _runs(targets):
    os.makedirs(run_dir, exist_ok=True)
    fp = fingerprint(point_cfg, arm.name, arm.attention_dim)
    old_steps = _check(run_dir, fp)
    label = arm.label if points is None else f"{os.path.basename(folder)} {arm.label}"
    # Every process has read the folder before the primary changes it.
    if multihost.agree(old_steps is not None):
      if primary:
        _extend(run_dir, fp, old_steps)
      multihost.sync(f"extend {run_dir}")
      log(f"[{label}] extended from {old_steps} to {fp['steps']} steps")
    if os.path.exists(os.path.join(run_dir, "result.json")):
      log(f"[{label}] finished earlier; skipped")
    else:
      pending.append((point_cfg, folder, arm))

  def report(point_cfg, folder):
    write_reports(folder, point_cfg)
    if points is not None:
      return write_grid_reports(workdir, cfg, points)
    return None

  if cfg.workers > 1 and len(pending) > 1:
    if mesh is not None:
      raise ValueError(f"`workers` = {cfg.workers} trains pairs in separate single-device "
                       "processes; it cannot be combined with several devices.")
    pending.sort(key=lambda job: -job[2].attention_dim)
    finished = _run_in_workers(cfg.workers, pending, deadline, report)
  else:
    finished = True
    for point_cfg, folder, arm in pending:
      if multihost.anywhere(interrupts.requested() is not None):  # between two runs
        signum = interrupts.requested() or signal.SIGTERM
        log(f"{signal.Signals(signum).name}: stopped before [{arm.label}]; finished runs "
            "are kept, re-run the same command to continue")
        raise interrupts.Interrupted(signum)
      if not train_group(point_cfg, folder, arm, _data(point_cfg, loaded), mesh=mesh,
                         log=log, deadline=deadline):
        finished = False
        break
      if primary:
        report(point_cfg, folder)
  if not finished:
    log("time budget reached; re-run the same command to continue")
    return None
  if not primary:
    return None
  tables = [write_reports(folder, point_cfg) for point_cfg, folder in targets]
  return tables[0] if points is None else write_grid_reports(workdir, cfg, points)


def train_group(cfg: ExperimentConfig, workdir: str, arm: config_lib.Arm, data, *,
                mesh=None, log: Callable[[str], None] = print,
                deadline: float | None = None) -> bool:
  """Trains (or resumes) one sweep point and writes its results; False if
  `deadline` stopped it first (its checkpoint is saved)."""
  if deadline is not None and multihost.agree(time.time() > deadline):
    return False
  run_dir = group_dir(workdir, arm.name, arm.attention_dim)
  trainer = train_lib.EnsembleTrainer(cfg.point(arm), data, tuple(range(cfg.seeds)), mesh=mesh)
  log(f"[{arm.label}] {trainer.num_params:,} parameters, seeds {list(trainer.seeds)}")
  result = trainer.run(run_dir, log=log, deadline=deadline)
  if result is None:
    return False
  if not multihost.is_primary():
    return True
  if result.attention is not None:
    att = {k: (np.asarray(v).tolist() if k == "weights" else v)
           for k, v in result.attention.items()}
    checkpoints.atomic_write(os.path.join(run_dir, "attention.json"), checkpoints.to_json(att))
  checkpoints.atomic_write(os.path.join(run_dir, TRANSLATIONS),
                           checkpoints.to_json(result.translations, ensure_ascii=False))
  # Written last: its presence marks the pair finished. Each row says which
  # code, versions, device and command made it (not part of the fingerprint).
  checkpoints.atomic_write(os.path.join(run_dir, "result.json"),
                           checkpoints.to_json(list(map(provenance.stamp, result.rows)),
                                               indent=1))
  return True


# Flags that make XLA:CPU run each worker's programs on one thread: on 2 cores
# two single-threaded processes trained 14.6k target tokens/s together, one
# process with 2 threads 11.2k (one seed) and 8.7k (two vmapped seeds)
# (quick model, additive a = 128).
ONE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _worker_init(parent_pid: int, stop) -> None:
  """Set-up of a `--workers` process: single-threaded XLA, dies with the
  driver, and stops its run as the driver is asked to (`interrupts.watch`
  of the `stop` event)."""
  interrupts.watch(stop)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                             ONE_THREAD_XLA_FLAGS).strip()
  try:  # Linux: die with the parent (a `kill -9` of the driver stops its workers too)
    import ctypes  # pylint: disable=g-import-not-at-top
    import signal  # pylint: disable=g-import-not-at-top
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
    os._exit(1)
  provenance.fields()  # as the driver does: the commit as the run starts, not at its first row


_WORKER_DATA = {}


def _worker_task(cfg: ExperimentConfig, workdir: str, arm: config_lib.Arm,
                 deadline: float | None) -> bool:
  interrupts.check()  # asked to stop before this run began: nothing to save
  key = _data_key(cfg)
  if key not in _WORKER_DATA:
    _WORKER_DATA.clear()  # one dataset at a time in a worker
    _WORKER_DATA[key] = load_data(cfg)
  log = lambda line: print(line, flush=True)
  return train_group(cfg, workdir, arm, _WORKER_DATA[key], log=log, deadline=deadline)


def _run_in_workers(workers: int, pending: list, deadline: float | None, report) -> bool:
  """Trains the `(config, workdir, arm)` jobs of `pending` in `workers`
  processes; `report(config, workdir)` after each finishes.

  A stop requested of the driver (SIGTERM, Ctrl-C: `interrupts`) sets an
  event every worker watches: each running run saves its checkpoint after its
  step and the queued ones do not start; once every worker has answered, the
  driver raises `interrupts.Interrupted`.
  """
  import multiprocessing  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context("spawn")  # never fork a process that holds XLA threads
  stop = ctx.Event()
  interrupts.share(stop)
  finished, interrupted = True, False
  with ctx.Pool(min(workers, len(pending)), initializer=_worker_init,
                initargs=(os.getpid(), stop)) as pool:
    tasks = [(job, pool.apply_async(_worker_task, (*job, deadline))) for job in pending]
    for (point_cfg, folder, _), task in tasks:
      try:
        finished = task.get() and finished
      except interrupts.Interrupted:
        interrupted = True
        continue
      report(point_cfg, folder)
  if interrupted:
    raise interrupts.Interrupted(interrupts.requested() or signal.SIGTERM)
  return finished


def _check(run_dir: str, fp: dict, write: bool = True) -> int | None:
  """Refuses a run folder made with other settings; records them in a new one
  (unless `write` is False). Returns the folder's step count where `fp` only
  asks for more steps and the run can be extended (`_why_not_extended`), else
  None; the caller then extends it (`_extend`)."""
  path = os.path.join(run_dir, "config.json")
  if os.path.exists(path):
    old = checkpoints.read_json(
        path, dict, f"restore it, or delete the folder {run_dir} to train that run again")
    # A setting added to the config after the folder was made ran at its default.
    defaults = fingerprint(ExperimentConfig(), fp["arm"], fp["dim"])
    diff = {k: (old.get(k, defaults.get(k)), v) for k, v in fp.items()
            if old.get(k, defaults.get(k)) != v}
    if set(diff) == {"steps"}:
      why = _why_not_extended(old, fp)
      if why is None:
        return int(old["steps"])
      raise ValueError(f"{run_dir} holds a run of {old['steps']} steps, not {fp['steps']}, "
                       f"and {why}; use another --workdir or delete that folder.")
    if diff:
      shown = ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())
      raise ValueError(f"{run_dir} holds a run with other settings ({shown}); "
                       "use another --workdir or delete that folder.")
  elif write and multihost.is_primary():
    checkpoints.atomic_write(path, checkpoints.to_json(fp, indent=1, sort_keys=True))
  return None


def _why_not_extended(old: dict, fp: dict) -> str | None:
  """Why the run recorded as `old` cannot go on to `fp["steps"]` with the
  numbers a run of that length from scratch would give; None if it can.

  Under the constant schedule nothing in a step depends on the total: the
  batches, dropout keys and learning rate of step s are the same in a run of
  any length, so continuing the checkpoint of the last step gives the longer
  run's numbers, provided the shorter run evaluated (and logged diagnostics)
  only where the longer one does - its last step is an evaluation step of
  both (`test_extending_a_finished_run_gives_the_longer_runs_numbers`).
  """
  if fp["schedule"] != "constant":
    return f"the {fp['schedule']} schedule depends on the number of steps"
  if fp["steps"] < old["steps"]:
    return "a run cannot be shortened"
  for name in ("eval_every", "diag_every"):
    if old["steps"] % fp[name]:
      return (f"{old['steps']} is not a multiple of `{name}` = {fp[name]} (a longer run "
              "would not have evaluated at its last step)")
  return None


def _extend(run_dir: str, fp: dict, old_steps: int) -> None:
  """Turns the finished (or unfinished) run of `old_steps` in `run_dir` into
  an unfinished one of `fp["steps"]`: its result moves aside to
  `result.steps<old_steps>.json` (kept), then the new settings are recorded;
  training resumes from the last checkpoint. A kill between the two leaves an
  unfinished run of `old_steps` whose extension is asked again by a re-run."""
  result = os.path.join(run_dir, "result.json")
  if os.path.exists(result):
    os.replace(result, os.path.join(run_dir, f"result.steps{old_steps}.json"))
  checkpoints.atomic_write(os.path.join(run_dir, "config.json"),
                           checkpoints.to_json(fp, indent=1, sort_keys=True))
