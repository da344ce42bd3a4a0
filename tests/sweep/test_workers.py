"""`workers.run_in_workers` with toy jobs: a worker that dies or a run that
fails is named, the other runs finish and are reported, and the driver never
waits forever (it used to: a killed worker's task was never answered)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time

import pytest

from attention_jax.sweep import workers
from attention_jax.training import interrupts


@dataclasses.dataclass(frozen=True)
class ToyJob:
  label: str
  action: str  # 'ok', 'die', 'fail', 'bug', 'slow' (or 'slow:<steps>'), 'paused'
  folder: str
  marks: str | None = None  # where each job, as it starts, leaves a file `<label>.<action>`


def toy_train(job: ToyJob, *, log, deadline) -> bool:
  """Sent to the workers by name: does what `job.action` says."""
  del deadline
  log(f"[{job.label}] started in {os.getpid()}")
  if job.marks is not None:
    with open(os.path.join(job.marks, f"{job.label}.{job.action}"), "w"):
      pass
  if job.action == "die":  # what the out-of-memory killer does
    os.kill(os.getpid(), signal.SIGKILL)
  if job.action == "fail":
    raise ValueError(f"{job.folder}/metrics.jsonl is not a file")
  if job.action == "bug":
    raise KeyError("no such thing")
  if job.action.startswith("slow"):  # a run that checks for a stop after each 'step'
    for _ in range(int(job.action.partition(":")[2] or 200)):  # 0.05 s each
      time.sleep(0.05)
      interrupts.check()
  with open(os.path.join(job.folder, job.label), "w") as f:
    f.write(str(os.getpid()))
  return job.action != "paused"


def _run(tmp_path, actions, workers_count=2, marks=None, **kwargs):
  jobs = [ToyJob(f"job{i}", a, str(tmp_path), marks) for i, a in enumerate(actions)]
  reported, lines = [], []
  start = time.time()
  try:
    return workers.run_in_workers(workers_count, jobs, toy_train, None,
                                  lambda job: reported.append(job.label),
                                  log=lines.append, **kwargs), reported, lines
  finally:
    assert time.time() - start < 120  # never hangs


def test_every_job_runs_and_is_reported(tmp_path):
  finished, reported, lines = _run(tmp_path, ["ok", "ok", "ok"])
  assert finished and sorted(reported) == ["job0", "job1", "job2"] and not lines
  assert sorted(os.listdir(tmp_path)) == ["job0", "job1", "job2"]


def test_a_paused_job_makes_the_sweep_unfinished(tmp_path):
  # One worker (each started one is a Python with JAX imported, ~2 s of CPU).
  finished, reported, _ = _run(tmp_path, ["ok", "paused"], workers_count=1)
  assert not finished and sorted(reported) == ["job0", "job1"]


def test_a_killed_worker_is_named_and_the_other_runs_finish(tmp_path):
  with pytest.raises(workers.RunsFailed) as e:  # one worker: only its replacement can go on
    _run(tmp_path, ["die", "ok", "ok", "ok"], workers_count=1)
  message = str(e.value)
  assert message.startswith("1 of 4 runs failed: [job0] its worker process was killed by "
                            "SIGKILL (the kernel's out-of-memory killer")
  assert "re-run the same command" in message and "\n" not in message
  # The three others ran (the dead worker was replaced) and were reported.
  assert sorted(os.listdir(tmp_path)) == ["job1", "job2", "job3"]


def test_a_failing_run_does_not_stop_the_others_and_is_one_line(tmp_path):
  # The slow run checks for a stop every 0.05 s for 2 s: the failures are
  # answered within milliseconds of their worker's start, and a stop the
  # driver set for them would end it at its next check.
  with pytest.raises(workers.RunsFailed) as e:
    _run(tmp_path, ["fail", "slow:40", "bug"])
  message = str(e.value)
  assert f"[job0] {tmp_path}/metrics.jsonl is not a file" in message
  assert "[job2] KeyError: 'no such thing'" in message
  assert message.startswith("2 of 3 runs failed")
  assert os.listdir(tmp_path) == ["job1"]  # the slow run was not cut short


def test_a_report_that_raises_stops_no_run_and_is_named_among_the_failures(tmp_path):
  # It set the stop event: the slow run stopped after its step as if asked to
  # (a false "SIGTERM: checkpoint saved" line), and the driver ended on the
  # report's error instead of naming the failures.
  jobs = [ToyJob(f"job{i}", a, str(tmp_path)) for i, a in enumerate(["ok", "slow:40"])]
  lines = []

  def report(job):
    if job.label == "job0":
      raise ValueError(f"{tmp_path}/job0/result.json is damaged (not JSON)")

  with pytest.raises(workers.RunsFailed) as e:
    workers.run_in_workers(2, jobs, toy_train, None, report, log=lines.append)
  assert str(e.value).startswith(f"1 of 2 runs failed: [job0] its reports could not be "
                                 f"written: {tmp_path}/job0/result.json is damaged")
  assert sorted(os.listdir(tmp_path)) == ["job0", "job1"]  # the slow run was not cut short
  assert lines == [f"[job0] finished, but its reports could not be written: {tmp_path}/job0/"
                   "result.json is damaged (not JSON); the other runs go on"]


def test_a_stop_reaches_the_running_workers_after_a_death(tmp_path, monkeypatch):
  """SIGTERM while a worker is dead and another runs: the running one stops
  after its 'step' and the driver raises Interrupted (it used to ignore the
  first SIGTERM, blocked on the dead worker's answer)."""
  monkeypatch.setattr(interrupts, "_received", {"signum": None, "event": None, "unsaved": None})
  marks = tmp_path / "marks"
  marks.mkdir()
  results = tmp_path / "results"
  results.mkdir()

  def terminate():
    # Once job0's worker is about to kill itself and job1 runs (10 s unless
    # stopped): SIGTERM to this process, the driver, as the alarm did.
    wanted = {"job0.die", "job1.slow"}
    end = time.time() + 60
    while not wanted <= set(os.listdir(marks)):
      if time.time() > end:
        return  # never sent: the run below finishes and the test fails
      time.sleep(0.01)
    time.sleep(0.2)  # the kill -9 is the next statement of job0's worker
    os.kill(os.getpid(), signal.SIGTERM)

  interrupts.install()
  sender = threading.Thread(target=terminate, daemon=True)
  try:
    sender.start()
    with pytest.raises(interrupts.Interrupted) as e:
      _run(results, ["die", "slow", "ok", "ok"], marks=str(marks))
    assert e.value.signum == signal.SIGTERM
  finally:
    sender.join(timeout=120)
    for signum in interrupts.SIGNALS:
      signal.signal(signum, signal.SIG_DFL)
  assert "job1" not in os.listdir(results)  # stopped, not finished


@pytest.mark.parametrize("code,needle", [
    (-9, "killed by SIGKILL (the kernel's out-of-memory killer"),
    (-15, "killed by SIGTERM"),
    (1, "exited with status 1"),
])
def test_how_a_worker_died_is_said_in_words(code, needle):
  assert needle in workers.death(code)


# --- a worker per group of devices ------------------------------------------

@pytest.mark.parametrize("workers_count, environ, visible", [
    (2, {}, ["0,1,2,3", "4,5,6,7"]),
    (4, {}, ["0,1", "2,3", "4,5", "6,7"]),
    # Numbered within the driver's own devices.
    (4, {"CUDA_VISIBLE_DEVICES": "1,3,4,5,6,7,9,10"}, ["1,3", "4,5", "6,7", "9,10"]),
    (8, {}, [str(i) for i in range(8)])])
def test_device_groups_split_the_gpus_in_order(workers_count, environ, visible):
  groups = workers.device_groups(workers_count, "gpu", 8, environ=environ)
  assert [g["CUDA_VISIBLE_DEVICES"] for g in groups] == visible
  # Every device in exactly one group.
  named = [d for g in groups for d in g["CUDA_VISIBLE_DEVICES"].split(",")]
  assert len(named) == len(set(named)) == 8


@pytest.mark.parametrize("workers_count, devices, environ, visible", [
    (4, 1, {}, ["0"] * 4),
    (3, 1, {"CUDA_VISIBLE_DEVICES": "5"}, ["5"] * 3),  # the driver's own GPU
    (4, 2, {}, ["0", "0", "1", "1"]),
    (6, 2, {"CUDA_VISIBLE_DEVICES": "2,7"}, ["2", "2", "2", "7", "7", "7"])])
def test_more_workers_than_gpus_share_each_gpu_evenly(workers_count, devices, environ, visible):
  groups = workers.device_groups(workers_count, "gpu", devices, environ=environ)
  assert [g["CUDA_VISIBLE_DEVICES"] for g in groups] == visible
  assert workers.gpu_share(workers_count, devices) == workers_count // devices


def test_gpu_share_is_one_where_the_workers_split_the_gpus():
  assert [workers.gpu_share(w, 8) for w in (1, 2, 4, 8, 16, 12)] == [1, 1, 1, 1, 2, 1]
  assert workers.gpu_share(3, 1) == 3 and workers.gpu_share(1, 1) == 1


class _FakeDevice:
  def __init__(self, platform):
    self.platform = platform


@pytest.mark.parametrize("user, expected", [(None, "false"), ("false", "false"),
                                            ("true", "true")])
def test_workers_sharing_one_gpu_preallocate_nothing_and_get_its_memory_shared(
    monkeypatch, user, expected):
  import jax  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config  # pylint: disable=g-import-not-at-top
  from attention_jax.training import memory  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, "devices", lambda: [_FakeDevice("gpu")])
  monkeypatch.setattr(memory, "training_memory", lambda: 120 * 2**30)
  monkeypatch.setattr(workers.host_memory, "requested_platforms", lambda: ("cuda",))
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  if user is None:
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
  else:
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", user)
  groups, group_memory = workers.worker_groups(config.from_preset("smoke", workers=3), "auto")
  # Three workers on the one GPU, none pinned to a core (an environment each),
  # each checked against a third of its memory.
  assert groups == [{"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": expected}] * 3
  assert group_memory == 40 * 2**30


def test_device_groups_on_cpu_set_the_host_device_count_and_keep_other_flags():
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=x"}
  groups = workers.device_groups(2, "cpu", 8, environ=environ)
  assert groups == [{"XLA_FLAGS": "--xla_dump_to=x --xla_force_host_platform_device_count=4"}] * 2


@pytest.mark.parametrize("args, environ, match", [
    ((3, "gpu", 8), {}, r"^`--workers` = 3 must divide the 8 devices of this host or be a "
                        r"multiple of them \(GPUs shared\)"),
    ((3, "gpu", 2), {}, r"^`--workers` = 3 must divide the 2 devices"),
    ((3, "cpu", 8), {}, r"^`--workers` = 3 must divide the 8 devices of this host \(one"),
    ((0, "gpu", 8), {}, r"^`--workers` = 0 must divide"),
    ((2, "gpu", 8), {"CUDA_VISIBLE_DEVICES": "0,1"},
     r"^`--workers`: CUDA_VISIBLE_DEVICES names 2 devices but jax sees 8"),
    ((2, "tpu", 8), {}, r"^`--workers` = 2 on 8 tpu devices: .*--mesh")])
def test_device_groups_refuse_in_one_line_naming_the_flag(args, environ, match):
  with pytest.raises(ValueError, match=match) as e:
    workers.device_groups(*args, environ=environ)
  assert "\n" not in str(e.value)


def group_train(job: ToyJob, *, log, deadline) -> bool:
  """Sent to the workers by name: records the worker's device group (its
  `TOY_GROUP`) and, for 'devices', how many devices its JAX sees."""
  del deadline
  log(f"[{job.label}] started in {os.getpid()}")
  if job.action == "die":
    os.kill(os.getpid(), signal.SIGKILL)
  if job.action.startswith("wait:"):  # busy until another job's result exists (60 s at most)
    other = os.path.join(job.folder, job.action.removeprefix("wait:"))
    end = time.time() + 60
    while not os.path.exists(other) and time.time() < end:
      time.sleep(0.01)
  seen = {"pid": os.getpid(), "group": os.environ.get("TOY_GROUP")}
  if job.action == "devices":
    import jax  # pylint: disable=g-import-not-at-top
    seen["devices"] = jax.device_count()
  with open(os.path.join(job.folder, job.label), "w") as f:
    json.dump(seen, f)
  return True


def _seen(tmp_path, label):
  with open(tmp_path / label) as f:
    return json.load(f)


def test_each_worker_sees_only_its_group_of_devices(tmp_path):
  # 8 host devices split between 2 workers: each worker's JAX has 4.
  groups = workers.device_groups(
      2, "cpu", 8, environ={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  groups = [dict(g, TOY_GROUP=str(i), JAX_PLATFORMS="cpu") for i, g in enumerate(groups)]
  jobs = [ToyJob(f"job{i}", "devices", str(tmp_path)) for i in range(4)]
  reported = []
  assert workers.run_in_workers(2, jobs, group_train, None, lambda job: reported.append(job.label),
                                log=lambda line: None, environments=groups)
  assert sorted(reported) == ["job0", "job1", "job2", "job3"]
  seen = [_seen(tmp_path, f"job{i}") for i in range(4)]
  assert {s["devices"] for s in seen} == {4}
  assert {s["group"] for s in seen} == {"0", "1"}  # both groups trained
  assert len({s["pid"] for s in seen}) == 2


def test_a_dead_workers_replacement_takes_its_device_group(tmp_path):
  groups = [{"TOY_GROUP": "a"}, {"TOY_GROUP": "b"}]
  # job1 keeps b busy until job2 is done: were job2 left for b, it would wait
  # the 60 s out and then show b's group.
  jobs = [ToyJob(f"job{i}", a, str(tmp_path))
          for i, a in enumerate(["die", "wait:job2", "ok", "ok"])]
  with pytest.raises(workers.RunsFailed, match=r"^1 of 4 runs failed: \[job0\] its worker"):
    workers.run_in_workers(2, jobs, group_train, None, lambda job: None, log=lambda line: None,
                           environments=groups)
  first = _seen(tmp_path, "job1")
  assert first["group"] == "b"
  # While b trains the slow job, the next queued job goes to a's replacement, a
  # new process on a's devices (the job after it to whichever is free first).
  replaced = _seen(tmp_path, "job2")
  assert replaced["group"] == "a" and replaced["pid"] != first["pid"]
  assert _seen(tmp_path, "job3")["group"] in ("a", "b")


def test_a_worker_that_cannot_start_its_backend_fails_each_run_saying_why(tmp_path):
  # Held to a TPU this host lacks (what a worker whose chip cannot be opened
  # meets): no run trains, each names the backend; the worker does not die.
  jobs = [ToyJob(f"job{i}", "ok", str(tmp_path)) for i in range(3)]
  lines = []
  with pytest.raises(workers.RunsFailed) as e:
    workers.run_in_workers(1, jobs, group_train, None, lambda job: None, log=lines.append,
                           environments=[{"JAX_PLATFORMS": "tpu"}])
  message = str(e.value)
  assert message.startswith("3 of 3 runs failed: [job0] its worker could not start: "
                            "RuntimeError: Unable to initialize backend 'tpu'")
  assert message.count("its worker could not start") == 3 and "\n" not in message
  assert not any(os.path.exists(tmp_path / f"job{i}") for i in range(3))  # none trained
  assert len(lines) == 3 and all("could not start" in line for line in lines)


def test_workers_that_cannot_start_say_one_line_each_and_the_summary_says_none_finished(
    tmp_path, capfd):
  # A TPU worker's failed start printed jax's ~45-line traceback per worker,
  # and the summary said "The others finished" when none had.
  jobs = [ToyJob(f"job{i}", "ok", str(tmp_path)) for i in range(3)]
  with pytest.raises(workers.RunsFailed) as e:
    workers.run_in_workers(2, jobs, group_train, None, lambda job: None, log=lambda line: None,
                           environments=[{"JAX_PLATFORMS": "tpu"}] * 2)
  message = str(e.value)
  assert "None finished" in message and "others finished" not in message
  assert e.value.finished == 0
  err = capfd.readouterr().err
  assert "Traceback" not in err, err
  said = [line for line in err.splitlines() if "could not start" in line]
  assert sorted(line.split(":")[0] for line in said) == ["worker 0", "worker 1"], err
  # the last line of the error: what went wrong, not the first frame
  assert all("Unable to initialize backend 'tpu'" in line for line in said), err


def test_the_summary_counts_the_runs_that_finished(tmp_path):
  with pytest.raises(workers.RunsFailed) as e:
    _run(tmp_path, ["fail", "ok", "ok"], workers_count=1)
  assert "1 of 3 runs failed" in str(e.value) and "2 of 3 finished" in str(e.value)
  assert e.value.finished == 2
  # a run that pauses at the deadline is neither failed nor finished
  with pytest.raises(workers.RunsFailed) as e:
    _run(tmp_path, ["fail", "paused"], workers_count=1)
  assert "None finished" in str(e.value) and e.value.finished == 0


def test_one_line_of_an_error_is_its_last():
  chained = RuntimeError("Unable to initialize backend 'tpu'\nlibtpu.so: not found")
  assert workers.last_line(chained) == "RuntimeError: libtpu.so: not found"
  assert workers.last_line(ValueError("bad --workers")) == "bad --workers"
  assert workers.last_line(KeyError("x")) == "KeyError: 'x'"


def test_fewer_device_groups_than_workers_is_refused():
  with pytest.raises(ValueError, match="`--workers` = 2 needs as many device groups; 1 given"):
    workers.run_in_workers(2, [ToyJob("job0", "ok", "x")], group_train, None,
                           lambda job: None, environments=[{}])


# The driver's check of `--workers` on 8 host devices (`workers.worker_groups`):
# the groups each worker gets, and the refusals, each one line; prints them.
_GROUPS_SCRIPT = """
import json
from attention_jax.sweep import config, workers
out = {}
for name, workers_count, seeds, scheme in (("two", 2, 4, "members"), ("one", 1, 4, "members"),
                                          ("three", 3, 4, "members"),
                                          ("odd_members", 2, 3, "members"),
                                          ("auto", 4, 4, "auto")):
  cfg = config.from_preset("smoke", seeds=seeds, workers=workers_count)
  try:
    groups, group_memory = workers.worker_groups(cfg, scheme)
    assert group_memory is None  # host devices share the host's memory
    out[name] = groups
  except ValueError as e:
    out[name] = "error: " + str(e)
print("RESULT " + json.dumps(out))
"""


def test_the_driver_splits_8_devices_between_the_workers_and_checks_each_group():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
  proc = subprocess.run([sys.executable, "-c", _GROUPS_SCRIPT], cwd=root, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout.split("RESULT ", 1)[1])
  four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
          "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
  assert out["two"] == [four, four]
  assert out["one"] is None  # one worker: the run's members over every device, as before
  assert out["three"].startswith("error: `--workers` = 3 must divide the 8 devices")
  assert out["odd_members"].startswith(
      "error: `--mesh=members`: 3 members do not split over 4 devices")
  # auto on groups of 2 devices with 4 members: 2 each, accepted.
  assert [g["XLA_FLAGS"] for g in out["auto"]] == [
      "--xla_force_host_platform_device_count=2"] * 4
  assert all("\n" not in v for v in out.values() if isinstance(v, str))


# --- a worker per TPU chip ---------------------------------------------------

def test_tpu_groups_give_each_worker_one_chip_and_a_port_of_its_own():
  groups = workers.tpu_groups(4, 8, "v5e", base_port=9000)
  assert [g["TPU_VISIBLE_CHIPS"] for g in groups] == ["0", "1", "2", "3"]  # 4 chips idle
  assert [g["TPU_PROCESS_PORT"] for g in groups] == ["9000", "9001", "9002", "9003"]
  for g in groups:  # each a one-chip slice of its own, its address its own port
    assert g["TPU_CHIPS_PER_PROCESS_BOUNDS"] == g["TPU_PROCESS_BOUNDS"] == "1,1,1"
    assert g["TPU_PROCESS_ADDRESSES"] == f"localhost:{g['TPU_PROCESS_PORT']}"
    assert g["CLOUD_TPU_TASK_ID"] == "0" and g["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
  assert len(workers.tpu_groups(8, 8, "v6e")) == 8
  # Every generation given a chip per worker has a memory the driver checks runs against.
  assert set(workers.TPU_HBM_GIB) == set(workers.ONE_DEVICE_TPU_CHIPS)


@pytest.mark.parametrize("args, match", [
    ((9, 8, "v5e"), r"^`--workers` = 9 on a TPU VM of 8 chips: .* give at most 8\.$"),
    ((0, 8, "v5e"), r"^`--workers` = 0 on a TPU VM of 8 chips"),
    ((2, 4, "v3"), r"^`--workers` = 2 on TPU v3 chips: .*--mesh`\.$"),
    ((2, 4, None), r"^`--workers` = 2 on TPU None chips")])
def test_tpu_groups_refuse_in_one_line_naming_the_flag(args, match):
  with pytest.raises(ValueError, match=match) as e:
    workers.tpu_groups(*args)
  assert "\n" not in str(e.value)


def test_tpu_chips_are_read_without_a_backend_and_none_where_jax_cannot_say(monkeypatch):
  from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                      lambda: (8, hardware_utils.TpuVersion.v5e))
  assert workers.tpu_chips() == (8, "v5e")
  monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                      lambda: (0, None))
  assert workers.tpu_chips() == (0, None)
  monkeypatch.delattr(hardware_utils, "num_available_tpu_chips_and_device_id")
  assert workers.tpu_chips() == (0, None)


# The driver's choice on a TPU VM (`workers.worker_groups`), the chips faked:
# it must never open a chip (its workers need them all), so it ends on the
# CPU; every refusal is one line before any work. Prints what it saw.
_TPU_SCRIPT = """
import json, os
from attention_jax.sweep import config, workers
workers.tpu_chips = lambda: (4, "v5e")
out = {}
for name, workers_count in (("too_many", 5), ("two", 2)):
  cfg = config.from_preset("smoke", workers=workers_count)
  try:
    out[name] = workers.worker_groups(cfg, "auto")
  except ValueError as e:
    out[name] = "error: " + str(e)
out["started_before_devices"] = workers.backend_started()
import jax
out["driver_platform"] = jax.devices()[0].platform
out["again"] = None
try:
  workers.worker_groups(config.from_preset("smoke", workers=2), "auto")
except ValueError as e:
  out["again"] = "error: " + str(e)
print("RESULT " + json.dumps(out))
"""


def test_the_driver_gives_each_worker_a_tpu_chip_and_keeps_off_them_itself():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-c", _TPU_SCRIPT], cwd=root, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout.split("RESULT ", 1)[1])
  assert out["too_many"] == ("error: `--workers` = 5 on a TPU VM of 4 chips: each worker "
                             "opens one chip of its own; give at most 4.")
  groups, group_memory = out["two"]
  assert [g["TPU_VISIBLE_CHIPS"] for g in groups] == ["0", "1"]
  assert {g["JAX_PLATFORMS"] for g in groups} == {"tpu"}  # a worker never falls back to CPU
  assert group_memory == 16 * 2**30  # a v5e chip's, not the host's shared by the workers
  # Nothing had started a backend when the driver chose, and it then ran on the CPU.
  assert out["started_before_devices"] is False
  assert out["driver_platform"] == "cpu"
  assert out["again"].startswith("error: `--workers` = 2 on a TPU VM: this process has "
                                 "already started a JAX backend")
