"""A workdir of runs with member values (`--members`) reports as the
`--sweep` grid it equals: the same rows, tables, tests and plots."""

import json
import os
import random

from attention_jax.analysis import reports
from attention_jax.sweep import config
from attention_jax.sweep import workdir as workdir_lib
from attention_jax import files

ARMS = ("additive", "multiplicative")
RATES = (1e-3, 3e-3)
SEEDS = 2
WORDS = "the a of to and in is it that was he for on are as with his they".split()


def _runs():
  """{arm: [member]}: each member (values outer, seeds inner, as the trainer
  orders them) with its result row, its metrics-log lines and its test
  translations; every number differs by arm, rate and seed."""
  rng = random.Random(0)
  refs = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(40)]
  out = {}
  for a, arm in enumerate(ARMS):
    members = []
    for r, lr in enumerate(RATES):
      for seed in range(SEEDS):
        keep = 0.9 - 0.3 * a - 0.2 * r - 0.05 * seed
        hyps = [" ".join(w if rng.random() < keep else rng.choice(WORDS) for w in x.split())
                for x in refs]
        bleu = 10.0 * (a + 1) + 3.0 * r + seed
        row = {"arm": arm, "dim": 8, "seed": seed, "learning_rate": lr, "model": "rnn",
               "dataset": "copy", "params": 1000 + a, "steps": 120, "train_seconds": 1.0,
               "val_bleu": bleu, "best_step": 120, "test_bleu": bleu, "val_ppl": 5.0 - r,
               "diverged_at_step": None, "diagnostics": {"max_logit": 7.0 + 10 * r + a}}
        log = [{"step": s, "seed": seed, "learning_rate": lr, "loss": 3.0 - s / 100,
                "max_logit": (7.0 + 10 * r + a) * s / 120} for s in (60, 120)]
        members.append({"lr": lr, "row": row, "log": log, "hyps": hyps})
    out[arm] = members
  return refs, out


def _write_run(run, members, refs, drop_values):
  """A finished run folder of `members`; `drop_values`: as a grid point's
  run writes them, without the member values."""
  strip = (lambda d: {k: v for k, v in d.items() if k != "learning_rate"}) if drop_values else (
      lambda d: d)
  os.makedirs(run.path)
  files.atomic_write(run.result, files.to_json([strip(m["row"]) for m in members]))
  files.atomic_write(run.metrics, "".join(files.to_json(strip(line)) + "\n"
                                          for m in members for line in m["log"]))
  files.atomic_write(run.translations, files.to_json(
      {"references": refs, "hypotheses": [m["hyps"] for m in members]}))


def _read_rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_a_members_workdir_reports_as_the_grid_it_equals(tmp_path):
  refs, runs = _runs()
  plain = config.from_preset("smoke", arms=ARMS, dims=(8,), seeds=SEEDS)
  cfg = plain.replace(members="learning_rate=1e-3,3e-3")
  members = workdir_lib.Workdir(str(tmp_path / "members"))
  grid = workdir_lib.Workdir(str(tmp_path / "grid"))
  points = config.grid(plain, (("learning_rate", RATES),))
  assert reports.member_points(cfg) == points
  for arm, run_members in runs.items():
    arm_ = config.Arm.of(arm, 8)
    _write_run(members.run(arm_), run_members, refs, drop_values=False)
    for p in points:
      mine = [m for m in run_members if m["lr"] == p.values["learning_rate"]]
      _write_run(grid.point(p).run(arm_), mine, refs, drop_values=True)

  text = reports.write_reports(members, cfg)
  grid_text = reports.write_grid_reports(grid, plain, points)
  # Every line but the first (which says where the other settings are recorded).
  assert text.splitlines()[1:] == grid_text.splitlines()[1:]
  assert "each run's config.json" in text.splitlines()[0]
  assert _read_rows(members.results) == _read_rows(grid.results)
  rows = _read_rows(members.results)
  assert sorted((r["arm"], r["learning_rate"], r["seed"]) for r in rows) == sorted(
      (arm, lr, seed) for arm in ARMS for lr in RATES for seed in range(SEEDS))
  assert all(r["max_logit"] == r["diagnostics"]["max_logit"] for r in rows)
  # The arms against the learning rate, a cell per rate: mean ± std (max) over seeds.
  assert "| learning_rate | additive | multiplicative |" in text
  assert "| 0.001 | 10.50 ± 0.71 (11.00) | 20.50 ± 0.71 (21.00) |" in text
  assert "| 0.003 | 13.50 ± 0.71 (14.00) | 23.50 ± 0.71 (24.00) |" in text
  # The paired tests of each rate's members, cached per rate beside the run.
  assert "| learning_rate | multiplicative − additive |" in text
  run = members.run(config.Arm.of("multiplicative", 8))
  for p in points:
    alone = grid.point(p).run(config.Arm.of("multiplicative", 8)).significance
    assert (files.read_json(run.significance_of(p.name), dict)["result"]
            == files.read_json(alone, dict)["result"])
  # validation.png: validation and loss curves, a column per rate.
  for path in (members.sweep_plot("learning_rate"), members.max_logit_plot,
               members.validation_plot):
    assert os.path.getsize(path) > 1000, path
  # --report_only's path rewrites the same table.
  os.remove(members.table)
  assert reports.write(members, cfg) == text
