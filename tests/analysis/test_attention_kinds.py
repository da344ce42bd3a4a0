"""The per-kind attention history of a Transformer sweep
(attention_jax/analysis/attention_kinds.py, experiments/attention_kinds.py):
runs found through the workdir's layout, a `--sweep` grid read point by
point, and the committed tables reproduced from the committed metrics logs."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from attention_jax.analysis import attention_kinds
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT = os.path.join(ROOT, "results", "transformer_cpu")


def _row(step, seed, max_logit, saturated):
  """A diagnostics row of the metrics log: two layers per kind."""
  row = {"step": step, "seed": seed, "loss": 1.0, "max_logit": max(max_logit.values())}
  for kind in attention_kinds.KINDS:
    for layer in (0, 1):
      row[f"max_logit_{kind}_l{layer}"] = max_logit[kind] * (1 + layer)
      row[f"saturated_{kind}_l{layer}"] = saturated[kind] * layer
  return row


def _write_log(workdir, arm, rows):
  path = workdir.run(arm).metrics
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def _copy_committed_runs(folder):
  """A workdir of the committed d_k ablation's metrics logs, laid out as the sweep lays it out."""
  cfg = config_lib.from_preset("transformer")
  workdir = workdir_lib.Workdir(str(folder))
  for arm in cfg.sweep():
    source = os.path.join(RESULT, "steps2000", "metrics",
                          f"{arm.name}_d{arm.attention_dim}.jsonl")
    if os.path.exists(source):
      os.makedirs(workdir.run(arm).path, exist_ok=True)
      shutil.copy(source, workdir.run(arm).metrics)
  return cfg


@pytest.mark.parametrize("stage, last_step", [("steps2000", math.inf), ("steps1500", 1500)])
def test_the_committed_kind_tables_come_from_the_committed_logs(tmp_path, stage, last_step):
  cfg = _copy_committed_runs(tmp_path)
  points = attention_kinds.grid_histories(str(tmp_path), cfg, last_step=last_step)
  with open(os.path.join(RESULT, stage, "kinds.md"), encoding="utf-8") as f:
    assert attention_kinds.grid_markdown(points) == f.read()


def test_a_grid_is_read_point_by_point_and_saturation_needs_every_seed(tmp_path):
  cfg = config_lib.from_preset("transformer", arms=("dot", "scaled_dot"), dims=(16,))
  axes = (("learning_rate", (0.001, 0.002)),)
  first, second = config_lib.grid(cfg, axes)
  low = {"encoder_self": 0.0, "decoder_self": 0.0, "cross": 0.0}
  for point, scale in ((first, 1.0), (second, 10.0)):
    workdir = workdir_lib.Workdir(str(tmp_path)).point(point)
    rows = []
    for step in (100, 200, 300):
      for seed in (0, 1):
        # the decoder's self attention: seed 0 saturates at step 200, seed 1 at 300
        hit = step >= 200 + 100 * seed
        rows.append(_row(step, seed, {k: scale * step for k in low},
                         {**low, "decoder_self": 0.6 if hit else 0.4}))
      rows.append({"step": step, "seed": 0, "bleu": 1.0})  # a validation row: no diagnostics
    _write_log(workdir, config_lib.Arm.of("dot", 16), rows)
  points = attention_kinds.grid_histories(str(tmp_path), cfg, axes)
  assert list(points) == [first.name, second.name]
  assert list(points[first.name]) == [("dot", 16)]  # scaled_dot has no log: left out
  text = attention_kinds.grid_markdown(points)
  assert text.startswith(f"## {first.name}\n\n") and f"\n## {second.name}\n\n" in text
  # the largest over the two layers (layer 1: twice layer 0), mean over seeds
  assert "| `dot` | 16 | 300 | 200.0 → 600.0 (0%) | 200.0 → 600.0 (60%) |" in text
  assert "| `dot` | 16 | 300 | 2000.0 → 6000.0 (0%) |" in text
  assert text.count("| `dot` | 16 | – | 300 | – |") == 2  # not 200: seed 1 is not saturated
  # steps after --last_step are left out
  cut = attention_kinds.grid_histories(str(tmp_path), cfg, axes, last_step=200)
  assert max(cut[first.name][("dot", 16)]) == 200
  with pytest.raises(ValueError, match="no grid point"):
    attention_kinds.grid_markdown({first.name: {}, second.name: {}})


def test_the_command_refuses_a_workdir_without_runs_in_one_line(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.attention_kinds",
                         "--preset=transformer", f"--workdir={tmp_path}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      f"error: `--workdir` {tmp_path} holds no run of --preset=transformer (with the flags "
      "given) that logged attention diagnostics."]
