"""experiments.launch: a sweep as a job array through submitit, on its local
executor and on a real one-node SLURM (scripts/slurm_local.sh)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = ["--preset=smoke", "--arms=additive,multiplicative", "--dims=8", "--steps=40",
         "--eval_every=20", "--checkpoint_every=20", "--diag_every=20", "--log_every=10",
         "--eval_examples=16", "--test_examples=16"]


def _env(**extra):
  from attention_jax.sweep import workers  # pylint: disable=g-import-not-at-top
  return {**os.environ, "XLA_FLAGS": conftest.xla_flags_with(workers.ONE_THREAD_XLA_FLAGS),
          **extra}


def _run(module, *args, env=None, timeout=900):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env or _env(),
                        capture_output=True, text=True, timeout=timeout)


def _numbers(workdir):
  with open(os.path.join(workdir, "results.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return sorted((r["arm"], r["dim"], r["seed"], r["val_bleu"], r["test_bleu"], r["best_step"],
                 r["val_ppl"], json.dumps(r["diagnostics"], sort_keys=True)) for r in rows)


@pytest.mark.parametrize("args, line", [
    (["--", "--preset=smoke"],
     "error: the ablation's flags after -- must name --workdir (a folder every task reaches)."),
    (["--", "--preset=smoke", "--workdir=W", "--shard=0/2"],
     "error: give no --shard or --report_only after --: the launcher sets them per task."),
    (["--shards=0", "--", "--preset=smoke", "--workdir=W"], "error: --shards must be >= 1, got 0."),
    (["--", "--preset=smoke", "--workdir=W", "--arms=bogus"], None),  # the ablation's own line
    (["--status"], "error: --status needs --folder (the launch's folder)."),
])
def test_bad_input_is_one_line_before_anything_is_submitted(tmp_path, args, line):
  args = [a.replace("W", str(tmp_path / "w")) for a in args]
  folder = [] if args == ["--status"] else [f"--folder={tmp_path / 'launch'}"]
  proc = _run("experiments.launch", "--backend=local", *folder, *args)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  if line is None:
    assert last.startswith("error: ") and "arms" in last
  else:
    assert last == line
  assert not os.path.exists(tmp_path / "w") and not os.path.exists(tmp_path / "launch")


def test_status_of_a_folder_without_a_launch_is_one_line(tmp_path):
  proc = _run("experiments.launch", "--status", f"--folder={tmp_path}")
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: --folder: no launch.json in {str(tmp_path)!r}; is it a launch's folder?")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("single") / "w"
  proc = _run("experiments.ablation", *SMOKE, f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.slow  # two smoke sweeps, one as 2 submitit tasks and a report
def test_the_local_backend_runs_the_shards_and_the_report_as_one_driver(single, tmp_path):
  workdir, folder = tmp_path / "w", tmp_path / "launch"
  proc = _run("experiments.launch", "--backend=local", "--shards=2", f"--folder={folder}",
              "--", *SMOKE, f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "all 2 shards and the report finished" in proc.stdout
  assert _numbers(workdir) == _numbers(single)
  assert open(workdir / "table.md").read() == open(single / "table.md").read()
  status = _run("experiments.launch", "--status", f"--folder={folder}")
  assert status.returncode == 0, status.stderr
  lines = status.stdout.strip().splitlines()
  assert [l.split(";")[0] for l in lines] == ["shard 0/2: done", "shard 1/2: done", "report: done"]


# --- a real scheduler -----------------------------------------------------------------


def _slurm_or_skip():
  """Starts the one-node SLURM of scripts/slurm_local.sh (installing Debian's
  slurm-wlm and munge where missing) and returns its environment; skips with
  the one reason where this machine cannot (no root, no apt)."""
  script = os.path.join(ROOT, "scripts", "slurm_local.sh")
  if os.geteuid() != 0:
    pytest.skip("a one-node SLURM needs root (scripts/slurm_local.sh)")
  if shutil.which("sbatch") is None:
    if shutil.which("apt-get") is None:
      pytest.skip("no SLURM and no apt-get to install it (slurm-wlm, munge)")
    install = subprocess.run(["bash", script, "install"], capture_output=True, text=True,
                             timeout=1200)
    if install.returncode:
      pytest.skip(f"installing slurm-wlm and munge failed: {install.stderr[-500:]}")
  start = subprocess.run(["bash", script, "start"], capture_output=True, text=True, timeout=300)
  assert start.returncode == 0, start.stdout + start.stderr
  conf = start.stdout.strip().splitlines()[-1].split("=", 1)[1]
  return {"SLURM_CONF": conf}


def _squeue(env):
  out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=60).stdout
  return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


def _wait_until(predicate, seconds, what):
  deadline = time.time() + seconds
  while time.time() < deadline:
    if predicate():
      return
    time.sleep(1)
  raise AssertionError(f"gave up waiting {seconds} s for {what}")


@pytest.mark.slow  # a real one-node SLURM: an array of 2 tasks and its report, then a requeue
@pytest.mark.timeout(3600)
def test_a_slurm_array_equals_one_driver_and_a_preempted_task_resumes(single, tmp_path):
  env = _slurm_or_skip()
  workdir, folder = tmp_path / "w", tmp_path / "launch"
  launch = _run("experiments.launch", "--backend=slurm", "--shards=2", "--time_min=30",
                f"--folder={folder}", "--", *SMOKE, f"--workdir={workdir}", env=_env(**env))
  assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
  state = json.loads((folder / "launch.json").read_text())
  jobs = [t["job_id"] for t in state["tasks"]] + [state["report"]["job_id"]]
  _wait_until(lambda: not set(jobs) & set(_squeue(env)), 1800, "the array and its report")
  assert (folder / "report.done").exists(), (folder / "report.failed").exists()
  assert _numbers(workdir) == _numbers(single)
  assert open(workdir / "table.md").read() == open(single / "table.md").read()

  # A task preempted (SIGUSR2, as SLURM sends it before a time limit or a
  # preemption): submitit checkpoints it (the ablation saves at its step) and
  # requeues it; run again, it resumes from the checkpoint.
  workdir2, folder2 = tmp_path / "w2", tmp_path / "launch2"
  slow = [f for f in SMOKE if not f.startswith("--steps=")] + ["--steps=400"]
  launch = _run("experiments.launch", "--backend=slurm", "--shards=1", "--time_min=30",
                f"--folder={folder2}", "--", *slow, f"--workdir={workdir2}", env=_env(**env))
  assert launch.returncode == 0, launch.stderr[-3000:]
  task = json.loads((folder2 / "launch.json").read_text())["tasks"][0]["job_id"]
  checkpoints = workdir2 / "runs" / "additive_d8" / "checkpoints"
  _wait_until(lambda: checkpoints.is_dir() and any(checkpoints.iterdir()), 900,
              "the first checkpoint")
  # To the job's steps, as `--signal=USR2@...` sends it (the batch shell is not signalled).
  subprocess.run(["scancel", "--signal=USR2", task], env={**os.environ, **env},
                 check=True, timeout=60)
  _wait_until(lambda: task not in _squeue(env) or (folder2 / "shard-0.done").exists(), 1800,
              "the requeued task to finish")
  _wait_until(lambda: (folder2 / "shard-0.done").exists(), 1800, "the requeued task to finish")
  log = open(task_log(folder2, task)).read()
  assert "resum" in log.lower(), log[-3000:]
  rows = [json.loads(l) for l in open(workdir2 / "results.jsonl")] if (
      workdir2 / "results.jsonl").exists() else []
  assert rows, log[-3000:]


def task_log(folder, job_id):
  """The stdout of a submitit task (`<folder>/<job id>_0_log.out` for an array task)."""
  state = json.loads((folder / "launch.json").read_text())
  return next(t["log"] for t in state["tasks"] if t["job_id"] == job_id)
