"""The attention-dimensionality ablation: arms x dims, seeds vmapped.

Workdir layout (everything written atomically; a re-run resumes):

  runs/<arm>_d<dim>/config.json     settings the run was made with
  runs/<arm>_d<dim>/checkpoints/    Orbax checkpoints (latest two)
  runs/<arm>_d<dim>/metrics.jsonl   loss, softmax diagnostics, validation BLEU
  runs/<arm>_d<dim>/attention.json  alignment of test sentence 0 (seed 0)
  runs/<arm>_d<dim>/result.json     one row per seed; its presence = finished
  results.jsonl, table.md, ablation.png, diagnostics.png, attention_<arm>_<dim>.png
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import numpy as np

from attention_jax.data import input_pipeline
from attention_jax.training import checkpoints
from attention_jax.training import reporting
from attention_jax.training import train_lib
from attention_jax.training.config import ExperimentConfig


# Fields that may differ between a run and its resumption without changing
# its numbers.
RESUMABLE_FIELDS = ("arms", "dims", "max_minutes", "log_every")


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


def write_reports(workdir: str, cfg: ExperimentConfig) -> str:
  """Regenerates results.jsonl, table.md and the plots from the finished runs."""
  rows = finished_rows(workdir, cfg)
  reporting.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)
  table = reporting.britz_table(rows, cfg.arms, cfg.dims)
  header = (f"Test BLEU (sacrebleu), mean ± std (max) over seeds; model={cfg.model}, "
            f"dataset={cfg.dataset}, steps={cfg.steps}, beam={cfg.beam_size}.\n\n")
  checkpoints.atomic_write(os.path.join(workdir, "table.md"), header + table)
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
  return header + table


def run(cfg: ExperimentConfig, workdir: str, *, mesh=None,
        log: Callable[[str], None] = print,
        data=None) -> str | None:
  """Runs (or resumes) the whole sweep; returns the table, or None if stopped early."""
  os.makedirs(workdir, exist_ok=True)
  deadline = time.time() + 60 * cfg.max_minutes if cfg.max_minutes else None
  data = data if data is not None else load_data(cfg)
  seeds = tuple(range(cfg.seeds))
  for arm in cfg.arms:
    for dim in cfg.dims:
      run_dir = group_dir(workdir, arm, dim)
      os.makedirs(run_dir, exist_ok=True)
      _check(run_dir, fingerprint(cfg, arm, dim))
      if os.path.exists(os.path.join(run_dir, "result.json")):
        log(f"[{arm} d={dim}] finished earlier; skipped")
        continue
      if deadline is not None and time.time() > deadline:
        log("time budget reached; re-run the same command to continue")
        return None
      trainer = train_lib.EnsembleTrainer(cfg, arm, dim, data, seeds, mesh=mesh)
      log(f"[{arm} d={dim}] {trainer.num_params:,} parameters, seeds {list(seeds)}")
      result = trainer.run(run_dir, log=log, deadline=deadline)
      if result is None:
        return None
      if result.attention is not None:
        att = {k: (np.asarray(v).tolist() if k == "weights" else v)
               for k, v in result.attention.items()}
        checkpoints.atomic_write(os.path.join(run_dir, "attention.json"), json.dumps(att))
      checkpoints.atomic_write(os.path.join(run_dir, "result.json"),
                               json.dumps(result.rows, indent=1))
      write_reports(workdir, cfg)
  return write_reports(workdir, cfg)


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
  else:
    checkpoints.atomic_write(path, json.dumps(fp, indent=1, sort_keys=True))
