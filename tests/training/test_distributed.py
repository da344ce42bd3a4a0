"""`jax.distributed` on one machine: two CPU processes on localhost train one
ablation together and give the numbers of one process with the same two
devices; only process 0 writes results."""

import collections
import glob
import json
import os
import socket
import subprocess
import sys

import pytest

from tests import conftest

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--preset=smoke", "--arms=additive", "--dims=8", "--steps=60"]
EVENTS = "events.out.tfevents."


def _ablation(workdir, *extra, env=None):
  return subprocess.Popen(
      [sys.executable, "-m", "experiments.ablation", *ARGS, f"--workdir={workdir}", *extra],
      cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def _files(workdir):
  """Every file outside the Orbax checkpoint folders, relative to `workdir`,
  with how many of each: a TensorBoard event file's name carries the time it
  was opened and the writer's PID, so those files count under one name per
  folder (`events.out.tfevents.*`) and their contents are compared as numbers
  (`_scalars`)."""
  out = collections.Counter()
  for root, dirs, files in os.walk(workdir):
    dirs[:] = [d for d in dirs if d != "checkpoints"]
    for name in files:
      if name.startswith(EVENTS):
        name = EVENTS + "*"
      out[os.path.relpath(os.path.join(root, name), workdir)] += 1
  return out


def _scalars(workdir):
  """{(seed folder, tag): [(step, value)]} of every TensorBoard event file under
  `workdir`, read with TensorBoard's own reader; the throughput is left out
  (a clock, like `train_seconds`)."""
  out = {}
  for folder in sorted(glob.glob(os.path.join(workdir, "runs", "*", "tensorboard", "seed_*"))):
    acc = event_accumulator.EventAccumulator(folder)
    acc.Reload()
    for tag in acc.Tags()["scalars"]:
      if tag != "train/target_tokens_per_second":
        key = (os.path.relpath(folder, workdir), tag)
        out[key] = [(e.step, e.value) for e in acc.Scalars(tag)]
  return out


def _slurm_environment(process: int, processes: int = 2) -> dict[str, str]:
  """What SLURM sets for task `process` of a job step of `processes` tasks
  on this one node: the variables jax's SLURM cluster reads (the job id sets
  the coordinator's port, the step's first node its host)."""
  return {"SLURM_JOB_ID": str(4000 + _free_port() % 64), "SLURM_STEP_NODELIST": "localhost",
          "SLURM_NTASKS": str(processes), "SLURM_PROCID": str(process),
          "SLURM_LOCALID": str(process), "SLURM_STEP_NUM_NODES": "1"}


@pytest.mark.slow  # three smoke runs, one of two processes
@pytest.mark.parametrize("how", ["flags", "slurm"])
def test_two_processes_equal_one_process_with_two_devices_and_only_process_0_writes(
    tmp_path, how):
  # Added to the inherited flags, which the two processes below run under.
  one = _ablation(tmp_path / "one", env={
      "XLA_FLAGS": conftest.xla_flags_with("--xla_force_host_platform_device_count=2")})
  out_one, _ = one.communicate(timeout=600)
  assert one.returncode == 0, out_one

  if how == "flags":
    coordinator = f"localhost:{_free_port()}"
    procs = [_ablation(tmp_path / "two", f"--coordinator_address={coordinator}",
                       "--num_processes=2", f"--process_id={i}") for i in range(2)]
  else:  # JAX's own cluster detection reads a SLURM job step's environment
    job = _slurm_environment(0)["SLURM_JOB_ID"]
    procs = [_ablation(tmp_path / "two", "--coordinator_address=auto",
                       env={**_slurm_environment(i), "SLURM_JOB_ID": job}) for i in range(2)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs

  # The same numbers: every result field but the clock and the provenance (the
  # command differs), every metrics line.
  strip = lambda rows: [{k: v for k, v in r.items() if k not in ("train_seconds", "provenance")}
                        for r in rows]
  rows_one = strip(_rows(tmp_path / "one" / "results.jsonl"))
  assert rows_one == strip(_rows(tmp_path / "two" / "results.jsonl"))
  assert all(r["test_bleu"] is not None for r in rows_one)
  metrics = os.path.join("runs", "additive_d8", "metrics.jsonl")
  assert _rows(tmp_path / "two" / metrics) == _rows(tmp_path / "one" / metrics)

  # The same TensorBoard numbers, step by step, for every seed and tag.
  scalars = _scalars(tmp_path / "one")
  assert scalars and any(tag == "test/bleu" for _, tag in scalars)
  assert _scalars(tmp_path / "two") == scalars

  # Process 1 wrote nothing of its own: the same files as one process, one
  # event file per seed (so no metrics line or event twice), no table on its
  # output.
  files = _files(tmp_path / "one")
  assert _files(tmp_path / "two") == files
  assert [n for f, n in files.items() if f.endswith(EVENTS + "*")] == [1, 1]
  assert "| dim |" in outs[0] and "| dim |" not in outs[1]
  assert "process 1 of 2: done; process 0 writes the results" in outs[1]


@pytest.mark.parametrize("extra, env, message", [
    (["--coordinator_address=auto", "--num_processes=2"], {},
     "error: `--coordinator_address=auto` reads the processes from the scheduler: give no "
     "`--num_processes` or `--process_id`."),
    (["--coordinator_address=localhost:1234"], {},
     "error: `--coordinator_address`, `--num_processes` and `--process_id` must be given "
     "together (or `--coordinator_address=auto` alone under a scheduler)."),
    (["--coordinator_address=auto"], {"SLURM_JOB_ID": ""},
     "error: `--coordinator_address=auto`: coordinator_address should be defined. (jax found "
     "no SLURM, Open MPI, Kubernetes or Cloud TPU environment); give "
     "--coordinator_address=HOST:PORT --num_processes and --process_id instead."),
])
def test_distributed_flags_are_refused_in_one_line_before_any_connection(tmp_path, extra, env,
                                                                          message):
  clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.ablation", *ARGS, f"--workdir={tmp_path / 'w'}",
       *extra], cwd=ROOT, env={**clean, **{k: v for k, v in env.items() if v}},
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == message
  assert not os.path.exists(tmp_path / "w")
