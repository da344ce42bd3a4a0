"""`--sweep` grids: axis parsing, expansion, one workdir per point
(resumed and skipped per point), pivoted tables and plots."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from attention_jax.sweep import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_axes_are_typed_by_their_field():
  assert config.parse_axis("learning_rate=3e-4, 1e-3,3e-3") == (
      "learning_rate", (3e-4, 1e-3, 3e-3))
  assert config.parse_axis("batch_size=32,64") == ("batch_size", (32, 64))
  assert config.parse_axis("cell=gru,lstm") == ("cell", ("gru", "lstm"))


@pytest.mark.parametrize("text,needle", [
    ("bogus=1,2", "'bogus', which is not a config field"),
    ("learning_rate", "FIELD=V1,V2"),
    ("learning_rate=", "has no values"),
    ("batch_size=32,6.5", "'6.5' is not a int"),
    ("learning_rate=1e-3,0.001", "repeats a value"),
    ("dims=8,16", "use --dims"),
    ("workers=1,2", "does not change a run's numbers"),
    ("cell=gru/x", "cannot name a folder"),
])
def test_bad_axes_name_the_problem(text, needle):
  with pytest.raises(ValueError, match="`--sweep`") as info:
    config.parse_axis(text)
  assert needle in str(info.value)


def test_grid_is_the_product_with_the_first_axis_slowest_and_each_point_checked():
  cfg = config.from_preset("smoke")
  axes = (config.parse_axis("learning_rate=1e-3,3e-3"), config.parse_axis("batch_size=16,32"))
  points = config.grid(cfg, axes)
  assert [p.values for p in points] == [
      {"learning_rate": 1e-3, "batch_size": 16}, {"learning_rate": 1e-3, "batch_size": 32},
      {"learning_rate": 3e-3, "batch_size": 16}, {"learning_rate": 3e-3, "batch_size": 32}]
  assert [p.name for p in points][:2] == ["learning_rate=0.001,batch_size=16",
                                          "learning_rate=0.001,batch_size=32"]
  assert all(p.config == cfg.replace(**p.values) for p in points)
  with pytest.raises(ValueError, match="`learning_rate` must be in"):
    config.grid(cfg, (config.parse_axis("learning_rate=1e-3,-1"),))
  with pytest.raises(ValueError, match="`num_heads` applies only to the Transformer"):
    config.grid(cfg, (config.parse_axis("num_heads=2,4"),))
  with pytest.raises(ValueError, match="names a field twice"):
    config.grid(cfg, (config.parse_axis("steps=2,4"), config.parse_axis("steps=8")))


def _driver(*flags):
  return subprocess.run([sys.executable, "-m", "experiments.ablation", *flags], cwd=ROOT,
                        capture_output=True, text=True)


_BAD_SWEEPS = [
    (["--sweep=bogus=1,2"], "bogus"),
    (["--sweep=learning_rate=abc"], "learning_rate"),
    (["--sweep=learning_rate=1e-3,-1"], "learning_rate"),
    (["--learning_rate=1e-3", "--sweep=learning_rate=1e-3,3e-3"], "both"),
]


def _check_refused(proc, workdir, needle):
  assert proc.returncode != 0
  err = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  assert len(err) == 1 and needle in err[0], proc.stderr
  assert not os.path.exists(workdir)


@pytest.fixture(scope="module")
def refused_in_one_process(tmp_path_factory, run_refusals):
  """The driver's `main` on each bad sweep, in one process
  (tests/drivers.py): flags -> (result, its workdir)."""
  workdirs = [tmp_path_factory.mktemp("bad_sweep") / "w" for _ in _BAD_SWEEPS]
  results = run_refusals("experiments.ablation",
                         [(["--preset=smoke", f"--workdir={w}", *flags], ROOT)
                          for w, (flags, _) in zip(workdirs, _BAD_SWEEPS)])
  return {tuple(flags): (r, w) for (flags, _), r, w in zip(_BAD_SWEEPS, results, workdirs)}


def test_a_bad_sweep_stops_the_real_process_with_one_line_before_any_work(tmp_path):
  # The process itself once; every bad sweep through the driver's `main` below.
  flags, needle = _BAD_SWEEPS[0]
  _check_refused(_driver("--preset=smoke", f"--workdir={tmp_path / 'w'}", *flags),
                 tmp_path / "w", needle)


@pytest.mark.parametrize("flags,needle", _BAD_SWEEPS)
def test_a_bad_sweep_flag_is_one_line_before_any_work(refused_in_one_process, flags, needle):
  _check_refused(*refused_in_one_process[tuple(flags)], needle)


SMOKE = ["--preset=smoke", "--arms=qk_norm", "--dims=8", "--seeds=1", "--steps=40",
         "--eval_every=20", "--checkpoint_every=10", "--diag_every=10", "--workers=1",
         "--eval_examples=16", "--test_examples=16"]


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow  # about 90 s on 2 cores: in `make test-all`, out of the 10-minute default suite
def test_a_grid_resumes_and_skips_per_point_and_pivots_its_tables(tmp_path):
  grid = str(tmp_path / "grid")
  # One point made beforehand by a plain run into its folder: the grid skips it.
  piece = _driver(*SMOKE, "--learning_rate=0.001", f"--workdir={grid}/learning_rate=0.001")
  assert piece.returncode == 0, piece.stderr[-3000:]
  # The grid, killed while it trains the other point ...
  sweep = "--sweep=learning_rate=1e-3,3e-3"
  ckpt = os.path.join(grid, "learning_rate=0.003", "runs", "qk_norm_d8", "checkpoints")
  p = subprocess.Popen([sys.executable, "-m", "experiments.ablation", *SMOKE, sweep,
                        f"--workdir={grid}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while time.time() < deadline and p.poll() is None:
    if os.path.isdir(ckpt) and any(s.isdigit() and int(s) >= 20 for s in os.listdir(ckpt)):
      break
    time.sleep(0.05)
  assert p.poll() is None, "the grid finished before it could be killed"
  os.kill(p.pid, signal.SIGKILL)
  p.wait()
  # ... and run again: the earlier point is skipped, the killed one resumed.
  again = _driver(*SMOKE, sweep, f"--workdir={grid}")
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("finished earlier; skipped") == 1  # lr 0.001, made earlier
  assert "resumed at step" in again.stdout
  # Every line about a run names its grid point, not just the arm.
  run_lines = [l for l in again.stdout.splitlines() if l.startswith("[")]
  assert run_lines and all(l.startswith("[learning_rate=0.00") for l in run_lines), run_lines
  assert any("final evaluation: test BLEU" in l for l in run_lines)
  assert again.stdout.strip().splitlines()[-1].startswith("wrote ") and "table.md" in (
      again.stdout.strip().splitlines()[-1])
  rows = _rows(os.path.join(grid, "results.jsonl"))
  assert sorted((r["learning_rate"], r["arm"]) for r in rows) == [
      (0.001, "qk_norm"), (0.003, "qk_norm")]
  # (A resumed run ends with the numbers of an uninterrupted one: test_ablation.py's
  # kill test; a grid point is an ordinary workdir, so it holds here too.)
  # table.md: the arms against the swept axis; the plots of the grid.
  table = open(os.path.join(grid, "table.md")).read()
  assert "| learning_rate | qk_norm |" in table
  assert table.count("| 0.001 |") >= 3 and table.count("| 0.003 |") >= 3  # BLEU, ppl, logit
  for name in ("sweep_learning_rate.png", "max_logit.png"):
    assert os.path.getsize(os.path.join(grid, name)) > 1000, name
  run = os.path.join(grid, "learning_rate=0.003", "runs", "qk_norm_d8")
  metrics = _rows(os.path.join(run, "metrics.jsonl"))
  assert "max_logit" in metrics[0] and "qk_norm_g" in metrics[0]
  # TensorBoard saw the kill too: each logged step once, as in metrics.jsonl.
  accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  events = accumulator.EventAccumulator(os.path.join(run, "tensorboard", "seed_0"))
  events.Reload()
  assert [(e.step, round(e.value, 3)) for e in events.Scalars("train/loss")] == [
      (r["step"], round(r["loss"], 3)) for r in metrics if "loss" in r]
  assert [e.step for e in events.Scalars("attention/max_logit")] == [
      r["step"] for r in metrics if "max_logit" in r]
  # --report_only rewrites the same reports without training; other settings are refused.
  os.remove(os.path.join(grid, "table.md"))
  report = _driver(*SMOKE, sweep, f"--workdir={grid}", "--report_only")
  assert report.returncode == 0, report.stderr[-3000:]
  assert open(os.path.join(grid, "table.md")).read() == table
  assert "resumed" not in report.stdout and "parameters, seeds" not in report.stdout
  other = _driver(*SMOKE, sweep, f"--workdir={grid}", "--report_only", "--seeds=2")
  assert other.returncode != 0 and "seeds: 1 there vs 2 now" in other.stderr
