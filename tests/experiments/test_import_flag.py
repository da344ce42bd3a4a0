"""`--import`: a score registered from one's own module reaches the drivers'
command line, its rows record the flag, and `--report_only` of its workdir works."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = textwrap.dedent("""\
    from attention_jax import registry, scores
    from attention_jax.score_kinds import Form

    def half_dot(q, k):
      return 0.5 * scores.dot(q, k)

    registry.register(registry.Score("half_dot", "<q, k> / 2", "a test of --import",
                                     rnn=Form(half_dot), projected=True))
    """)
FLAGS = ["--preset=transformer_smoke", "--arms=scaled_dot,half_dot", "--dims=8", "--steps=20",
         "--warmup_steps=5",
         "--eval_every=10", "--checkpoint_every=10", "--diag_every=10", "--log_every=10",
         "--eval_examples=8", "--test_examples=8"]


def _ablation(tmp_path, *args):
  env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'mods'}{os.pathsep}"
                                     f"{os.environ.get('PYTHONPATH', '')}"}
  return subprocess.run([sys.executable, "-m", "experiments.ablation", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture
def module(tmp_path):
  (tmp_path / "mods").mkdir()
  (tmp_path / "mods" / "my_scores.py").write_text(MODULE)
  return tmp_path


def test_without_the_import_the_score_is_refused_and_a_bad_module_is_one_line(module):
  proc = _ablation(module, *FLAGS, f"--workdir={module / 'w'}")
  assert proc.returncode == 1 and "half_dot" in proc.stderr.strip().splitlines()[-1]
  proc = _ablation(module, "--import=no_such_module", *FLAGS, f"--workdir={module / 'w'}")
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: `--import`: cannot import 'no_such_module': ModuleNotFoundError: No module "
      "named 'no_such_module'")
  assert not (module / "w").exists()


@pytest.mark.slow  # a transformer_smoke sweep of two arms, then its report
def test_an_imported_score_trains_and_its_rows_can_be_reported_again(module):
  workdir = module / "w"
  # With --workers: each worker process, started afresh, imports the module too.
  proc = _ablation(module, "--import=my_scores", *FLAGS, "--workers=2", f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in open(workdir / "results.jsonl")]
  assert {r["arm"] for r in rows} == {"scaled_dot", "half_dot"}
  assert all("--import=my_scores" in r["provenance"]["command"] for r in rows)
  table = (workdir / "table.md").read_text()
  proc = _ablation(module, "--import=my_scores", *FLAGS, f"--workdir={workdir}",
                   "--report_only")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (workdir / "table.md").read_text() == table
