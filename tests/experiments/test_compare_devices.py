"""experiments.compare_devices: another device's sweep beside the committed one."""

import json
import os
import subprocess
import sys

import pytest

from experiments import compare_devices as cd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(arm, dim, seed, bleu, steps=3500):
  return {"arm": arm, "dim": dim, "seed": seed, "test_bleu": bleu, "model": "rnn",
          "dataset": "bible_en_es", "steps": steps, "params": 10}


def _write(folder, rows):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "results.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def test_each_cell_is_compared_with_the_reference_seeds():
  reference = [_row("additive", 128, 0, 14.0), _row("additive", 128, 1, 15.0),
               _row("multiplicative", 1024, 0, 4.0), _row("multiplicative", 1024, 1, None)]
  other = [_row("additive", 128, 0, 14.2), _row("additive", 128, 1, 14.6),
           _row("multiplicative", 1024, 0, 6.0), _row("multiplicative", 1024, 1, 7.0)]
  records, table = cd.compare(reference, other)
  add, mul = records
  # additive: reference 14.5 +- 0.71 (sample std), other 14.4, inside [14, 15]
  assert add["reference_mean"] == pytest.approx(14.5)
  assert add["reference_std"] == pytest.approx(0.5 ** 0.5)
  assert add["other_mean"] == pytest.approx(14.4) and add["delta"] == pytest.approx(-0.1)
  assert add["inside"] is True
  # multiplicative: the diverged reference seed is left out of its mean; 6.5 is outside [4, 4]
  assert mul["reference_mean"] == pytest.approx(4.0) and mul["inside"] is False
  assert "| multiplicative | 1024 | 4.00 / diverged | 4.00 ± 0.00 | 6.00 / 7.00 | 6.50 | " \
         "+2.50 | no | – |" in table


def test_seed_paired_tests_are_shown_where_given():
  reference = [_row("additive", 128, s, 14.0 + s) for s in (0, 1)]
  other = [_row("additive", 128, s, 14.5 + s) for s in (0, 1)]
  _, table = cd.compare(reference, other, {("additive", 128): {
      "deltas": [0.5, 0.5], "p": [0.2, 0.01]}})
  assert "+0.50 (p 0.200), +0.50 (p 0.010)" in table


def test_another_recipe_is_refused_naming_the_field():
  reference = [_row("additive", 128, 0, 14.0)]
  assert cd.recipe_problem(reference, [_row("additive", 128, 0, 14.0, steps=100)]) == (
      "the two sweeps ran different recipes: `steps` is ['3500'] in --reference and "
      "['100'] in --other.")
  assert cd.recipe_problem(reference, reference) is None


def test_the_command_line(tmp_path):
  _write(tmp_path / "cpu", [_row("additive", 128, s, 14.0 + s) for s in (0, 1)])
  _write(tmp_path / "gpu", [_row("additive", 128, s, 14.2 + s) for s in (0, 1)])
  run = lambda *a: subprocess.run([sys.executable, "-m", "experiments.compare_devices", *a],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
  out = tmp_path / "cmp" / "compare.md"
  proc = run(f"--reference={tmp_path / 'cpu'}", f"--other={tmp_path / 'gpu'}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr
  assert "| additive | 128 | 14.00 / 15.00 | 14.50 ± 0.71 | 14.20 / 15.20 | 14.70 | +0.20 | " \
         "yes | – |" in out.read_text()
  proc = run(f"--reference={tmp_path / 'nowhere'}", f"--other={tmp_path / 'gpu'}")
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: --reference: no results.jsonl in {str(tmp_path / 'nowhere')!r}; is it a "
      "sweep's folder?")
