r"""A sweep as a job array: one task per shard, then its report, through submitit.

    python -m experiments.launch --backend=slurm --shards=4 --partition=gpu \
        --gpus_per_task=1 --time_min=240 -- --preset=quick --workdir=/shared/runs/quick
    python -m experiments.launch --backend=local --shards=2 -- --preset=transformer_smoke \
        --workdir=runs/tsmoke
    python -m experiments.launch --status --folder=runs/tsmoke/launch

Everything after `--` is `experiments.ablation`'s flags, checked by the
ablation itself (`--show_config`) before anything is submitted: a bad flag is
its one line. Task I of N runs `python -m experiments.ablation FLAGS
--shard=I/N` (its share of the sweep's runs, `sweep.shards`); the report job
then runs `python -m experiments.ablation FLAGS --report_only`, the table one
driver writes. The workdir must be a folder every task can reach (a shared
filesystem with working `flock`: docs/cluster.md).

Backends (submitit's, not ours):
  slurm  a SLURM job array (`submitit.AutoExecutor` on a cluster: `map_array`),
         at most --array_parallelism tasks at once, and the report job with
         `--dependency=afterany` on the array. A task preempted or near its time
         limit gets SIGUSR2 from SLURM (submitit asks for it --signal_delay_s
         before the end): its shard's ablation is stopped with SIGTERM (the
         trainer saves its checkpoint after the step under way), and submitit
         requeues the task, which resumes from the checkpoints.
  local  the same tasks as local processes (`submitit.LocalExecutor`), then the
         report, waited for here: a workstation, and the tests.

Each launch writes `launch.json` into --folder (default WORKDIR/launch): the
backend, the job ids and every task's log; each task marks its end there
(`shard-I.done` or `.failed`). `--status` reads them, and SLURM's queue, and
says per shard whether it is done, failed, running or pending, with its log.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("slurm", "local")
STATE = "launch.json"
# How long a task waits for its ablation to save a checkpoint after SIGTERM
# before submitit requeues it (the trainer finishes the step under way, then
# saves: seconds on the presets here; SLURM's KillWait, 30 s by default, is
# what a requeue leaves it after that).
STOP_SECONDS = 120

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_enum("backend", "local", BACKENDS, "slurm: a SLURM job array; local: local "
                    "processes (submitit's local executor).")
  flags.DEFINE_integer("shards", 2, "Array tasks: the sweep's runs split into this many "
                       "shares (`--shard=I/N`).")
  flags.DEFINE_string("folder", "", "Where the tasks' logs and launch.json go (default: "
                      "<workdir>/launch).")
  flags.DEFINE_string("partition", "", "SLURM partition ('' = the cluster's default).")
  flags.DEFINE_integer("gpus_per_task", 0, "GPUs per array task.")
  flags.DEFINE_integer("cpus_per_task", 1, "CPU cores per array task.")
  flags.DEFINE_integer("mem_gb", 0, "Memory per array task, GiB (0 = the partition's default).")
  flags.DEFINE_integer("time_min", 60, "Time limit per array task, minutes; a task stopped by "
                       "it is requeued and resumes from its checkpoints.")
  flags.DEFINE_integer("array_parallelism", 16, "Array tasks running at once, at most.")
  flags.DEFINE_integer("signal_delay_s", 120, "SIGUSR2 this many seconds before the time "
                       "limit, for the checkpoint.")
  flags.DEFINE_bool("wait", None, "Wait for the tasks and the report (default: local yes, "
                    "slurm no).")
  flags.DEFINE_bool("status", False, "Say how the launch in --folder stands, and exit.")


def ablation_command(argv: list[str], *extra: str) -> list[str]:
  return [sys.executable, "-m", "experiments.ablation", *argv, *extra]


def workdir_of(argv: list[str]) -> str | None:
  """The `--workdir` among the ablation's flags (`--workdir=X` or `--workdir X`)."""
  for i, arg in enumerate(argv):
    if arg.startswith("--workdir="):
      return arg.split("=", 1)[1]
    if arg == "--workdir" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def check_ablation_flags(argv: list[str]) -> str | None:
  """The ablation's own one-line refusal of `argv` (None if it takes
  them), before anything is submitted: `--show_config` checks every flag
  and builds the config without touching the workdir."""
  if workdir_of(argv) is None:
    return "the ablation's flags after -- must name --workdir (a folder every task reaches)."
  if any(a.startswith(("--shard=", "--report_only")) or a == "--shard" for a in argv):
    return "give no --shard or --report_only after --: the launcher sets them per task."
  proc = subprocess.run(ablation_command(argv, "--show_config"), cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  if proc.returncode:
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    return lines[-1] if lines else f"experiments.ablation exited with {proc.returncode}"
  return None


def _ignore_sigusr2() -> None:
  signal.signal(signal.SIGUSR2, signal.SIG_IGN)


@dataclasses.dataclass
class ShardTask:
  """One array task: `experiments.ablation ARGV --shard=I/N` as a child
  process. Submitit requeues it on preemption or at its time limit: then
  `checkpoint` stops the child with SIGTERM (it saves its checkpoint after
  the step under way) and hands submitit the same task, which, run again,
  resumes from the checkpoints."""
  argv: list[str]
  shards: int
  folder: str

  def __call__(self, index: int) -> int:
    # SLURM's warning signal (SIGUSR2, `--signal`) reaches every process of
    # the job step, the child too, whose default would be to die of it: the
    # child ignores it, and is stopped by `checkpoint`'s SIGTERM instead.
    self._child = subprocess.Popen(ablation_command(self.argv, f"--shard={index}/{self.shards}"),
                                   cwd=ROOT, preexec_fn=_ignore_sigusr2)
    # Polled, not waited for: submitit's SIGUSR2 handler (`checkpoint`) runs in
    # this thread and waits for the child itself, which it could not while
    # this frame held the child's wait lock (it would time out, then kill).
    while (code := self._child.poll()) is None:
      time.sleep(1)
    mark(self.folder, f"shard-{index}", code)
    if code:
      raise RuntimeError(f"shard {index}/{self.shards}: experiments.ablation exited with {code}")
    return code

  def checkpoint(self, index: int):
    import submitit  # pylint: disable=g-import-not-at-top
    child = getattr(self, "_child", None)
    if child is not None and child.poll() is None:
      child.send_signal(signal.SIGTERM)
      try:
        child.wait(timeout=STOP_SECONDS)
      except subprocess.TimeoutExpired:
        child.kill()
    return submitit.helpers.DelayedSubmission(ShardTask(self.argv, self.shards, self.folder),
                                              index)

  def __getstate__(self):  # the child process is not part of what is pickled
    return {"argv": self.argv, "shards": self.shards, "folder": self.folder}

  def __setstate__(self, state):
    self.__dict__.update(state)


@dataclasses.dataclass
class ReportTask:
  """The report job: `experiments.ablation ARGV --report_only`, the table a
  single driver writes, from the finished runs of every shard."""
  argv: list[str]
  folder: str

  def __call__(self) -> int:
    code = subprocess.run(ablation_command(self.argv, "--report_only"), cwd=ROOT).returncode
    mark(self.folder, "report", code)
    if code:
      raise RuntimeError(f"report: experiments.ablation --report_only exited with {code}")
    return code


def executor(backend: str, folder: str):
  """submitit's executor of `backend` with this launch's resources."""
  import submitit  # pylint: disable=g-import-not-at-top
  if backend == "local":
    ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(timeout_min=FLAGS.time_min, gpus_per_node=FLAGS.gpus_per_task,
                         cpus_per_task=FLAGS.cpus_per_task)
    return ex
  ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
  params = dict(timeout_min=FLAGS.time_min, cpus_per_task=FLAGS.cpus_per_task,
                slurm_array_parallelism=FLAGS.array_parallelism,
                slurm_signal_delay_s=FLAGS.signal_delay_s, name="attention_jax")
  if FLAGS.partition:
    params["slurm_partition"] = FLAGS.partition
  if FLAGS.gpus_per_task:
    params["slurm_gpus_per_task"] = FLAGS.gpus_per_task
  if FLAGS.mem_gb:
    params["mem_gb"] = FLAGS.mem_gb
  ex.update_parameters(**params)
  return ex


def launch(argv: list[str], backend: str, shards: int, folder: str, wait: bool) -> dict:
  """Submits the shards and the report; returns (and writes) the state."""
  ex = executor(backend, folder)
  jobs = ex.map_array(ShardTask(argv, shards, folder), list(range(shards)))
  if backend == "slurm":
    array_id = jobs[0].job_id.split("_")[0]
    ex.update_parameters(slurm_additional_parameters={"dependency": f"afterany:{array_id}"},
                         slurm_array_parallelism=1)
    report = ex.submit(ReportTask(argv, folder))
  else:
    report = None
  state = {"backend": backend, "shards": shards, "argv": argv,
           "tasks": [{"shard": i, "job_id": j.job_id, "log": str(j.paths.stdout)}
                     for i, j in enumerate(jobs)],
           "report": None if report is None else {"job_id": report.job_id,
                                                   "log": str(report.paths.stdout)}}
  write_state(folder, state)
  print(f"submitted {shards} shard tasks ({backend})"
        + (f" and the report job {report.job_id}" if report else "")
        + f"; logs and {STATE} in {folder}")
  if wait:
    failed = []
    for i, job in enumerate(jobs):
      try:
        job.result()
      except Exception as e:  # pylint: disable=broad-except
        failed.append(f"shard {i}/{shards}: {str(e).strip().splitlines()[-1]} "
                      f"(log {job.paths.stdout})")
    if report is None:
      report = ex.submit(ReportTask(argv, folder))
      state["report"] = {"job_id": report.job_id, "log": str(report.paths.stdout)}
      write_state(folder, state)
    try:
      report.result()
    except Exception as e:  # pylint: disable=broad-except
      failed.append(f"report: {str(e).strip().splitlines()[-1]} (log {report.paths.stdout})")
    state["failed"] = failed
    if failed:
      print(f"{len(failed)} of {shards + 1} tasks failed:\n  " + "\n  ".join(failed))
    else:
      print(f"all {shards} shards and the report finished")
  return state


def write_state(folder: str, state: dict) -> None:
  from attention_jax import files  # pylint: disable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  files.atomic_write(os.path.join(folder, STATE), json.dumps(state, indent=1))


def mark(folder: str, name: str, code: int) -> None:
  """`<folder>/<name>.done` (exit 0) or `.failed` (its exit code): how
  `--status` knows a task's end without SLURM's accounting database."""
  from attention_jax import files  # pylint: disable=g-import-not-at-top
  for old in (f"{name}.done", f"{name}.failed"):
    if os.path.exists(os.path.join(folder, old)):
      os.remove(os.path.join(folder, old))
  files.atomic_write(os.path.join(folder, f"{name}.{'failed' if code else 'done'}"),
                     json.dumps({"exit_code": code, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))


def ended(folder: str, name: str) -> str | None:
  """'done', 'failed (exit N)' or None (not ended) from `mark`'s file."""
  if os.path.exists(os.path.join(folder, f"{name}.done")):
    return "done"
  path = os.path.join(folder, f"{name}.failed")
  if os.path.exists(path):
    try:
      code = json.loads(open(path, encoding="utf-8").read()).get("exit_code")
    except ValueError:
      code = "?"
    return f"failed (exit {code})"
  return None


def slurm_queue() -> dict[str, str]:
  """{job id: state} of this user's jobs in SLURM's queue ({} without squeue)."""
  try:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True,
                         text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired):
    return {}
  return dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())


def status(folder: str) -> list[str]:
  """A line per shard (and the report): done, failed, running or queued
  (SLURM's word), or not started, with its log."""
  path = os.path.join(folder, STATE)
  if not os.path.isfile(path):
    raise ValueError(f"--folder: no {STATE} in {folder!r}; is it a launch's folder?")
  try:
    state = json.loads(open(path, encoding="utf-8").read())
    tasks = state["tasks"]
  except (ValueError, KeyError, TypeError):
    raise ValueError(f"{path}: not a launch's state.") from None
  queue = slurm_queue() if state.get("backend") == "slurm" else {}
  lines = []
  for task in tasks:
    i, job = task["shard"], str(task["job_id"])
    word = ended(folder, f"shard-{i}") or (queue[job].lower() if job in queue else
                                           "not running (no end recorded)")
    lines.append(f"shard {i}/{state['shards']}: {word}; log {task['log']}")
  report = state.get("report")
  if report:
    job = str(report["job_id"])
    word = ended(folder, "report") or (queue[job].lower() if job in queue else
                                       "not running (no end recorded)")
    lines.append(f"report: {word}; log {report['log']}")
  return lines


def main(argv):
  if FLAGS.status:
    if not FLAGS.folder:
      sys.exit("error: --status needs --folder (the launch's folder).")
    try:
      print("\n".join(status(FLAGS.folder)))
    except ValueError as e:
      sys.exit(f"error: {e}")
    return
  ablation_argv = list(argv[1:])
  if not ablation_argv:
    sys.exit("error: give the ablation's flags after --, e.g. -- --preset=smoke "
             "--workdir=runs/smoke")
  if FLAGS.shards < 1:
    sys.exit(f"error: --shards must be >= 1, got {FLAGS.shards}.")
  for name in ("time_min", "array_parallelism", "cpus_per_task"):
    if getattr(FLAGS, name) < 1:
      sys.exit(f"error: --{name} must be >= 1, got {getattr(FLAGS, name)}.")
  try:
    import submitit  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    sys.exit("error: submitit is not installed: make (the lock installs it) or pip install "
             "submitit.")
  if FLAGS.backend == "slurm" and subprocess.run(
      ["which", "sbatch"], capture_output=True).returncode:
    sys.exit("error: --backend=slurm: no sbatch on PATH (a SLURM login node, or "
             "scripts/slurm_local.sh start for a one-node cluster here).")
  problem = check_ablation_flags(ablation_argv)
  if problem:
    sys.exit(f"error: {problem}")
  folder = FLAGS.folder or os.path.join(workdir_of(ablation_argv), "launch")
  wait = FLAGS.backend == "local" if FLAGS.wait is None else FLAGS.wait
  state = launch(ablation_argv, FLAGS.backend, FLAGS.shards, folder, wait)
  if state.get("failed"):
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
