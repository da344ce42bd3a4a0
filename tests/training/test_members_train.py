"""A run with members at several learning rates (`--members`) trains each
member as the separate run at its rate would: the same losses, parameters
and BLEU, to float32 rounding, from one compiled program per (arm, dim)."""

import json
import os

import jax
import numpy as np
import pytest

from attention_jax.analysis import reports
from attention_jax.data import input_pipeline
from attention_jax.sweep import config
from attention_jax.sweep import runner
from attention_jax.training import run_config
from attention_jax.training import train_lib

RATES = (1e-3, 1e-2)
# The smoke model with dropout on (each member must draw its seed's stream),
# short: two validations, a checkpoint at each.
SMOKE = dict(arms=("multiplicative",), dims=(8,), seeds=1, dropout=0.1, steps=20,
             eval_every=10, checkpoint_every=10, diag_every=10, log_every=10,
             eval_examples=16, test_examples=16, beam_size=1)


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def _without(row, *keys):
  return {k: v for k, v in row.items() if k not in keys}


def _train(cfg, folder, data):
  trainer = train_lib.EnsembleTrainer(cfg.point(config.Arm.of("multiplicative", 8)), data)
  result = trainer.run(str(folder), log=lambda line: None)
  return trainer, result


@pytest.mark.slow  # three trainers compile: 2 min of CPU, 5.5 min wall on the loaded 2-core Xeon
def test_members_at_two_learning_rates_equal_two_separate_runs(tmp_path):
  cfg = config.from_preset("smoke", **SMOKE)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  joint, joint_result = _train(cfg.replace(members="learning_rate=1e-3,1e-2"),
                               tmp_path / "members", data)
  joint_log = _lines(tmp_path / "members" / "metrics.jsonl")
  assert [m.keys for m in joint.members] == [{"seed": 0, "learning_rate": lr} for lr in RATES]
  for e, lr in enumerate(RATES):
    alone, result = _train(cfg.replace(learning_rate=lr), tmp_path / f"lr{lr}", data)
    # Losses, diagnostics, validation BLEU and perplexity at every logged step.
    mine = [_without(r, "learning_rate") for r in joint_log if r["learning_rate"] == lr]
    assert mine == _lines(tmp_path / f"lr{lr}" / "metrics.jsonl")
    # The result row: test BLEU, best step, perplexity; and the member's rate.
    row = joint_result.rows[e]
    assert row["learning_rate"] == lr
    assert (_without(row, "learning_rate", "train_seconds")
            == _without(result.rows[0], "train_seconds"))
    assert joint_result.translations["hypotheses"][e] == result.translations["hypotheses"][0]
    for a, b in zip(jax.tree.leaves(joint.state.params), jax.tree.leaves(alone.state.params)):
      np.testing.assert_allclose(np.asarray(a)[e], np.asarray(b)[0], rtol=1e-5, atol=1e-7)
  # The two rates trained two different models.
  assert joint_log[0]["loss"] != joint_log[1]["loss"]
  # A checkpoint of other member values is refused, naming the flag.
  held = joint.state.arrays()
  other = run_config.with_member_values(held["opt_state"], {"learning_rate": (1e-3, 3e-3)})
  with pytest.raises(ValueError, match="--members cannot change"):
    joint.check_members({**held, "opt_state": other}, "the checkpoint")
  joint.check_members(held, "the checkpoint")  # its own: accepted


@pytest.mark.slow  # two members runs, one extended: 5.5 min wall on the loaded 2-core Xeon
def test_a_members_run_extended_and_resumed_equals_one_from_scratch(tmp_path):
  cfg = config.from_preset("smoke", **SMOKE, members="learning_rate=1e-3,1e-2")
  scratch = runner.run(cfg, str(tmp_path / "scratch"), report=reports.write)
  assert scratch is not None and "| learning_rate | multiplicative |" in scratch
  resumed_dir = str(tmp_path / "resumed")
  assert runner.run(cfg.replace(steps=10), resumed_dir, report=reports.write) is not None
  said = []
  resumed = runner.run(cfg, resumed_dir, report=reports.write, log=said.append)
  assert any("extended from 10 to 20 steps" in line for line in said)
  assert any("resumed at step 10" in line for line in said)
  assert resumed.splitlines()[1:] == scratch.splitlines()[1:]
  for name in ("results.jsonl", os.path.join("runs", "multiplicative_d8", "metrics.jsonl")):
    rows = [_without(r, "train_seconds", "provenance")
            for r in _lines(os.path.join(tmp_path, "scratch", name))]
    assert rows == [_without(r, "train_seconds", "provenance")
                    for r in _lines(os.path.join(resumed_dir, name))], name
  # Another member list is refused before any work, naming the setting and both values.
  with pytest.raises(ValueError, match=r"--workdir.*\(members: 'learning_rate=0.001,0.01' there "
                                       r"vs 'learning_rate=0.001,0.003' now\)"):
    runner.run(cfg.replace(members="learning_rate=1e-3,3e-3"), resumed_dir,
               report=reports.write)
