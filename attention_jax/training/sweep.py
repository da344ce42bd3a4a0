"""The attention-dimensionality ablation: arms x dims, seeds vmapped.

Workdir layout (everything written atomically; a re-run resumes):

  runs/<arm>_d<dim>/config.json     settings the run was made with
  runs/<arm>_d<dim>/checkpoints/    Orbax checkpoints (latest two)
  runs/<arm>_d<dim>/metrics.jsonl   loss, softmax diagnostics, validation BLEU
  runs/<arm>_d<dim>/attention.json  alignment of test sentence 0 (seed 0)
  runs/<arm>_d<dim>/test_translations.json  final test outputs per seed (for significance)
  runs/<arm>_d<dim>/significance.json       cached paired test against the baseline arm
  runs/<arm>_d<dim>/result.json     one row per seed; its presence = finished
  .lock                             PID, host and start of the driver using the workdir
  results.jsonl, table.md, ablation.png, validation.png, diagnostics.png,
  attention_<arm>_<dim>.png
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Callable

import jax
import numpy as np

from attention_jax.data import input_pipeline
from attention_jax.training import checkpoints
from attention_jax.training import config as config_lib
from attention_jax.training import multihost
from attention_jax.training import reporting
from attention_jax.training import significance as significance_lib
from attention_jax.training import train_lib
from attention_jax.training import workdir_lock
from attention_jax.training.config import ExperimentConfig


# Fields that may differ between a run and its resumption without changing
# its numbers.
RESUMABLE_FIELDS = ("arms", "dims", "max_minutes", "log_every", "workers")
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
        with open(path) as f:
          rows.extend(json.load(f))
  return rows


def baseline_arm(cfg: ExperimentConfig) -> str:
  """The arm the others are tested against: additive when swept, else the first."""
  return "additive" if "additive" in cfg.arms else cfg.arms[0]


def significance(workdir: str, cfg: ExperimentConfig) -> dict[tuple[str, int], dict]:
  """Seed-paired AR tests (`significance.compare_runs`) of every finished arm
  against the baseline arm at the same dimension, cached per pair in
  `significance.json` under the digest of both runs' translations."""
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
        with open(cache_path) as f:
          try:
            cached = json.load(f)
          except json.JSONDecodeError:  # cut by a kill: recomputed
            cached = None
      if cached is not None and cached.get("digest") == digest:
        out[(arm, dim)] = cached["result"]
        continue
      result = significance_lib.compare_runs(json.loads(base_bytes), json.loads(own_bytes))
      checkpoints.atomic_write(cache_path, json.dumps(
          {"baseline": base, "digest": digest, "result": result}))
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
      log = train_lib.MetricsLog(os.path.join(run_dir, "metrics.jsonl")).read()
      if log:
        histories[(arm, dim)] = log
      att_path = os.path.join(run_dir, "attention.json")
      if os.path.exists(att_path) and os.path.exists(os.path.join(run_dir, "result.json")):
        with open(att_path) as f:
          attention = json.load(f)
        reporting.plot_attention(attention, f"{arm}, a={dim}, seed 0",
                                 os.path.join(workdir, f"attention_{arm}_{dim}.png"))
  if histories:
    reporting.plot_diagnostics(histories, cfg.arms, os.path.join(workdir, "diagnostics.png"))
    reporting.plot_validation(histories, cfg.arms, os.path.join(workdir, "validation.png"))
  return text


def run(cfg: ExperimentConfig, workdir: str, *, mesh=None,
        log: Callable[[str], None] = print,
        data=None) -> str | None:
  """Runs (or resumes) the whole sweep; returns the table, or None if stopped early.

  With `cfg.workers > 1` the unfinished (arm, dim) pairs are trained that many
  at a time, each in its own single-threaded process (largest dimension
  first, so the longest runs start first); otherwise one after another here.
  """
  os.makedirs(workdir, exist_ok=True)
  if not multihost.is_primary():  # the primary holds the lock and writes every file
    _run_locked(cfg, workdir, mesh=mesh, log=log, data=data)
    log(f"process {jax.process_index()} of {jax.process_count()}: done; process 0 "
        "writes the results")
    return None
  with workdir_lock.WorkdirLock(workdir, log=log):  # one driver per workdir
    return _run_locked(cfg, workdir, mesh=mesh, log=log, data=data)


def _run_locked(cfg, workdir, *, mesh, log, data) -> str | None:
  primary = multihost.is_primary()
  for path in checkpoints.remove_stale_temporaries(workdir) if primary else ():
    log(f"removed {path}, left by an interrupted write")
  deadline = time.time() + 60 * cfg.max_minutes if cfg.max_minutes else None
  pending = []
  for arm in cfg.sweep():
    run_dir = group_dir(workdir, arm.name, arm.attention_dim)
    os.makedirs(run_dir, exist_ok=True)
    _check(run_dir, fingerprint(cfg, arm.name, arm.attention_dim))
    if os.path.exists(os.path.join(run_dir, "result.json")):
      log(f"[{arm.label}] finished earlier; skipped")
    else:
      pending.append(arm)
  if cfg.workers > 1 and len(pending) > 1:
    if mesh is not None:
      raise ValueError(f"`workers` = {cfg.workers} trains pairs in separate single-device "
                       "processes; it cannot be combined with several devices.")
    pending.sort(key=lambda arm: -arm.attention_dim)
    finished = _run_in_workers(cfg, workdir, pending, deadline)
  else:
    data = data if data is not None else load_data(cfg)
    finished = True
    for arm in pending:
      if not train_group(cfg, workdir, arm, data, mesh=mesh, log=log, deadline=deadline):
        finished = False
        break
      if primary:
        write_reports(workdir, cfg)
  if not finished:
    log("time budget reached; re-run the same command to continue")
    return None
  return write_reports(workdir, cfg) if primary else None


def train_group(cfg: ExperimentConfig, workdir: str, arm: config_lib.Arm, data, *,
                mesh=None, log: Callable[[str], None] = print,
                deadline: float | None = None) -> bool:
  """Trains (or resumes) one sweep point and writes its results; False if
  `deadline` stopped it first (its checkpoint is saved)."""
  if deadline is not None and multihost.agree(time.time() > deadline):
    return False
  run_dir = group_dir(workdir, arm.name, arm.attention_dim)
  trainer = train_lib.EnsembleTrainer(cfg, arm, data, tuple(range(cfg.seeds)), mesh=mesh)
  log(f"[{arm.label}] {trainer.num_params:,} parameters, seeds {list(trainer.seeds)}")
  result = trainer.run(run_dir, log=log, deadline=deadline)
  if result is None:
    return False
  if not multihost.is_primary():
    return True
  if result.attention is not None:
    att = {k: (np.asarray(v).tolist() if k == "weights" else v)
           for k, v in result.attention.items()}
    checkpoints.atomic_write(os.path.join(run_dir, "attention.json"), json.dumps(att))
  checkpoints.atomic_write(os.path.join(run_dir, TRANSLATIONS),
                           json.dumps(result.translations, ensure_ascii=False))
  # Written last: its presence marks the pair finished.
  checkpoints.atomic_write(os.path.join(run_dir, "result.json"),
                           json.dumps(result.rows, indent=1))
  return True


# Flags that make XLA:CPU run each worker's programs on one thread: on 2 cores
# two single-threaded processes trained 14.6k target tokens/s together, one
# process with 2 threads 11.2k (one seed) and 8.7k (two vmapped seeds)
# (quick model, additive a = 128; issue 9).
_ONE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _worker_init(parent_pid: int) -> None:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                             _ONE_THREAD_XLA_FLAGS).strip()
  try:  # Linux: die with the parent (a `kill -9` of the driver stops its workers too)
    import ctypes  # pylint: disable=g-import-not-at-top
    import signal  # pylint: disable=g-import-not-at-top
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
    os._exit(1)


_WORKER_DATA = {}


def _worker_task(cfg: ExperimentConfig, workdir: str, arm: config_lib.Arm,
                 deadline: float | None) -> bool:
  if "data" not in _WORKER_DATA:
    _WORKER_DATA["data"] = load_data(cfg)
  log = lambda line: print(line, flush=True)
  return train_group(cfg, workdir, arm, _WORKER_DATA["data"], log=log, deadline=deadline)


def _run_in_workers(cfg: ExperimentConfig, workdir: str, pending: list[config_lib.Arm],
                    deadline: float | None) -> bool:
  import multiprocessing  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context("spawn")  # never fork a process that holds XLA threads
  finished = True
  with ctx.Pool(min(cfg.workers, len(pending)), initializer=_worker_init,
                initargs=(os.getpid(),)) as pool:
    tasks = [pool.apply_async(_worker_task, (cfg, workdir, arm, deadline)) for arm in pending]
    for task in tasks:
      finished = task.get() and finished
      write_reports(workdir, cfg)
  return finished


def _check(run_dir: str, fp: dict) -> None:
  path = os.path.join(run_dir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    diff = {k: (old.get(k), v) for k, v in fp.items() if old.get(k) != v}
    if diff:
      shown = ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())
      raise ValueError(f"{run_dir} holds a run with other settings ({shown}); "
                       "use another --workdir or delete that folder.")
  elif multihost.is_primary():
    checkpoints.atomic_write(path, json.dumps(fp, indent=1, sort_keys=True))
