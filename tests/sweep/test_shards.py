"""Shards of one sweep as separate drivers on one workdir (`--shard=I/N`, the
runs' own locks): their rows are a single driver's, a shard killed with
`kill -9` and run again resumes from its checkpoint, and two drivers never
train one run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Three runs of the smoke model, a checkpoint every 20 steps; one XLA thread in
# every process (the thread count is part of the digits: docs/reproducibility.md).
FLAGS = ["--preset=smoke", "--arms=additive,multiplicative,scaled_multiplicative",
         "--dims=8", "--steps=40", "--eval_every=20", "--checkpoint_every=20",
         "--diag_every=20", "--log_every=10", "--eval_examples=16", "--test_examples=16"]


def _env():
  from attention_jax.sweep import workers  # pylint: disable=g-import-not-at-top
  return {**os.environ, "XLA_FLAGS": conftest.xla_flags_with(workers.ONE_THREAD_XLA_FLAGS)}


def _driver(workdir, *extra, wait=True):
  cmd = [sys.executable, "-m", "experiments.ablation", *FLAGS, f"--workdir={workdir}", *extra]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  if wait:
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out
  return proc


def _numbers(workdir):
  with open(os.path.join(workdir, "results.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return sorted((r["arm"], r["dim"], r["seed"], r["val_bleu"], r["test_bleu"], r["best_step"],
                 r["val_ppl"], json.dumps(r["diagnostics"], sort_keys=True)) for r in rows)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("single") / "w"
  code, out = _driver(workdir)
  assert code == 0, out[-3000:]
  return workdir


@pytest.mark.slow  # four smoke sweeps of three runs (about 2 min on 2 loaded cores)
def test_three_shards_at_once_write_a_single_drivers_rows_and_table(single, tmp_path):
  workdir = tmp_path / "w"
  procs = [_driver(workdir, f"--shard={i}/3", wait=False) for i in range(3)]
  outs = [p.communicate(timeout=900)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-2000:] for o in outs)
  # Each shard trained its own run, and only it.
  for i, out in enumerate(outs):
    arm = FLAGS[1].split("=")[1].split(",")[i]
    assert f"[{arm} d=8]" in out
  assert _numbers(workdir) == _numbers(single)
  # The last to finish wrote the whole table; --report_only writes the same.
  table = open(os.path.join(single, "table.md")).read()
  assert open(os.path.join(workdir, "table.md")).read() == table
  code, out = _driver(workdir, "--report_only")
  assert code == 0, out
  assert open(os.path.join(workdir, "table.md")).read() == table


@pytest.mark.slow  # a shard killed mid-run and run again, against a single driver
def test_a_shard_killed_mid_run_is_resumed_from_its_checkpoint_and_the_rows_are_the_same(
    single, tmp_path):
  workdir = tmp_path / "w"
  victim = _driver(workdir, "--shard=0/2", wait=False)
  checkpoint = os.path.join(workdir, "runs", "additive_d8", "checkpoints", "20")
  deadline = time.time() + 600
  while not os.path.isdir(checkpoint) and time.time() < deadline and victim.poll() is None:
    time.sleep(0.2)
  assert os.path.isdir(checkpoint), victim.communicate()[0][-3000:]
  victim.send_signal(signal.SIGKILL)
  victim.communicate()
  # The killed shard, run again, resumes its run from the checkpoint; having
  # done its share it takes the other shard's run too, which no live driver
  # holds (work stealing).
  code, out = _driver(workdir, "--shard=0/2")
  assert code == 0, out[-3000:]
  assert "[additive d=8] resumed at step 20" in out, out[-3000:]
  assert "[multiplicative d=8] shard 0/2: another shard's run, free: trained here" in out
  # The other shard, late, finds every run finished.
  code, out = _driver(workdir, "--shard=1/2")
  assert code == 0, out[-3000:]
  assert "0 runs trained here; all 3 runs of the sweep are finished" in out, out[-3000:]
  assert _numbers(workdir) == _numbers(single)


def test_a_bad_shard_is_one_line_before_any_work(tmp_path):
  code, out = _driver(tmp_path / "w", "--shard=3/3")
  assert code == 1
  assert out.strip().splitlines()[-1] == (
      "error: `--shard`: the index must be in 0..2 for 3 shards, got 3.")
  assert not os.path.exists(tmp_path / "w")


def test_a_run_another_driver_holds_is_left_to_it(tmp_path):
  # This process holds the lock of the sweep's only run, as a live driver
  # training it would: a shard driver leaves it and trains nothing.
  from attention_jax.sweep import workdir_lock  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "w"
  run = workdir / "runs" / "additive_d8"
  with workdir_lock.WorkdirLock(str(run), what="run"):
    code, out = _driver(workdir, "--shard=0/1", "--arms=additive")
  assert code == 0, out[-3000:]
  assert f"[additive d=8] run {run} is being trained by PID {os.getpid()}" in out
  assert "0 runs trained here" in out
  assert not (run / "metrics.jsonl").exists()


def test_shards_and_a_driver_of_the_whole_sweep_exclude_each_other(tmp_path):
  from attention_jax.sweep import workdir_lock  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "w"
  with workdir_lock.WorkdirLock(str(workdir)):  # a plain driver holds it
    code, out = _driver(workdir, "--shard=0/2")
  assert code == 1
  last = out.strip().splitlines()[-1]
  assert last.startswith(f"error: workdir {workdir} is in use by PID {os.getpid()} on ")
  assert last.endswith("a driver of the whole sweep; shards (--shard) share a workdir only "
                       "with other shards.")
  with workdir_lock.WorkdirLock(str(workdir), shared=True):  # a shard holds it
    code, out = _driver(workdir)
  assert code == 1
  assert out.strip().splitlines()[-1] == (
      f"error: workdir {workdir} is in use by other processes (drivers of its shards, "
      "--shard, name none); wait for it to finish or use another --workdir.")
