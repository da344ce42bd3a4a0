"""End-to-end tests of the ablation and train drivers (subprocesses, smoke preset)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _driver(name, *flags, env=None, **kw):
  cmd = [sys.executable, "-m", f"experiments.{name}", *flags]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        env={**os.environ, **(env or {})}, **kw)


def _rows(workdir):
  with open(os.path.join(workdir, "results.jsonl")) as f:
    return [json.loads(line) for line in f]


def _numbers(rows):
  """What must match between runs: everything but wall-clock time."""
  return sorted((r["arm"], r["dim"], r["seed"], r["val_bleu"], r["test_bleu"], r["best_step"],
                 json.dumps(r["diagnostics"], sort_keys=True)) for r in rows)


_BAD_FLAGS = [
    (["--arms=additive,bogus"], "arms"),
    (["--dims=128,abc"], "dims"),
    (["--seeds=0"], "seeds"),
    (["--model=cnn"], "model"),
    (["--dropout=2"], "dropout"),
    (["--model=transformer", "--cell=lstm"], "cell"),  # a flag of the other family
    (["--model=transformer", "--qk_init=xavier"], "qk_init"),
    (["--qk_init=premise"], "qk_init"),  # a Transformer flag, given to the RNN (quick preset)
]
_WARM_UP = ["--preset=transformer", "--steps=30"]
_SHOW = ["--preset=transformer_smoke", "--steps=50", "--qk_init=premise", "--show_config"]


@pytest.fixture(scope="module")
def in_one_process(tmp_path_factory, run_refusals):
  """The driver's `main` on each command line below, in one process
  (tests/drivers.py), each with a folder of its own:
  key -> (result, folder)."""
  calls = {}
  for flags, _ in _BAD_FLAGS:
    folder = tmp_path_factory.mktemp("bad_flag")
    calls[tuple(flags)] = ([f"--workdir={folder / 'w'}", *flags], folder)
  folder = tmp_path_factory.mktemp("warm_up")
  calls["warm up"] = ([*_WARM_UP, f"--workdir={folder / 'w'}"], folder)
  folder = tmp_path_factory.mktemp("show_config")
  calls["show config"] = (_SHOW, folder)
  results = run_refusals("experiments.ablation", list(calls.values()))
  return {key: (result, folder) for (key, (_, folder)), result in zip(calls.items(), results)}


def _check_refused(proc, folder, needle):
  assert proc.returncode != 0
  err = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  assert any(needle in l for l in err), proc.stderr
  assert len(err) <= 2, proc.stderr  # absl may add its "--helpfull" hint
  assert not os.path.exists(folder / "w" / "runs")  # no work was started


def test_a_bad_flag_fails_the_real_process_fast_with_one_clear_line(tmp_path):
  # The process itself (an enum flag: absl's parser refuses it, with its hint);
  # the other bad flags run through the driver's `main` in one process below.
  t0 = time.time()
  proc = _driver("ablation", f"--workdir={tmp_path / 'w'}", "--preset=huge")
  _check_refused(proc, tmp_path, "preset")
  assert time.time() - t0 < 60


@pytest.mark.parametrize("flags,needle", _BAD_FLAGS)
def test_bad_flags_fail_fast_with_one_clear_line(in_one_process, flags, needle):
  proc, folder = in_one_process[tuple(flags)]
  _check_refused(proc, folder, needle)


def test_show_config_prints_the_resolved_settings_and_where_each_comes_from(in_one_process):
  """--helpfull shows the dataclass defaults; --show_config what the run would use."""
  proc, folder = in_one_process["show config"]
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert "--steps=50  # flag" in lines and "--qk_init=premise  # flag" in lines
  assert "--warmup_steps=20  # preset" in lines and "--arms=dot,scaled_dot  # preset" in lines
  assert "--cell=gru  # default" in lines
  from attention_jax.sweep import config
  import dataclasses
  assert len(lines) == 1 + len(dataclasses.fields(config.ExperimentConfig))
  assert not os.listdir(folder)  # run from there: no workdir needed, nothing made


def test_a_warm_up_as_long_as_the_run_is_one_line_before_any_work(in_one_process):
  proc, folder = in_one_process["warm up"]
  assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
      "error: `warmup_steps` = 400 is not below `steps` = 30: the learning rate would never "
      "reach its peak, and the run would measure warm-up only; lower --warmup_steps or raise "
      "--steps."]
  assert not os.path.exists(folder / "w")


def test_one_run_needs_no_baseline():
  """A single arm has nothing to compare: the preset's baseline is no reason
  to refuse it (it was: "`baseline` 'scaled_dot' is not one of `arms`")."""
  from attention_jax.sweep import config
  cfg = config.from_preset("transformer", arms=("dot",), dims=(16,))
  assert cfg.arms == ("dot",)
  with pytest.raises(ValueError, match="`baseline` 'scaled_dot' is not one of `arms`"):
    config.from_preset("transformer", arms=("dot", "qk_norm"))


def test_helpfull_documents_every_field():
  proc = _driver("ablation", "--helpfull")
  assert proc.returncode in (0, 1)  # absl exits 1 after printing help
  from attention_jax.sweep import config
  import dataclasses
  text = " ".join(proc.stdout.split())  # absl wraps help lines
  for field in dataclasses.fields(config.ExperimentConfig):
    assert f"--{field.name}" in proc.stdout, field.name
    if field.name not in ("arms", "dims"):  # the driver's own flags, with their own help
      assert " ".join(field.metadata["help"].split()[:4]) in text, field.name


@pytest.mark.slow  # the whole smoke sweep, twice (~170 s); the 10-minute default suite
# keeps the train driver's end-to-end run with a kill (below) and the ablation driver's
# lock and full-disk tests (tests/training/test_reliability.py)
def test_smoke_preset_end_to_end(tmp_path):
  workdir = str(tmp_path / "smoke")
  proc = _driver("ablation", "--preset=smoke", f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  from attention_jax.sweep import config
  cfg = config.from_preset("smoke")
  rows = _rows(workdir)
  assert len(rows) == len(cfg.arms) * len(cfg.dims) * cfg.seeds
  assert {(r["arm"], r["dim"], r["seed"]) for r in rows} == {
      (a, d, s) for a in cfg.arms for d in cfg.dims for s in range(cfg.seeds)}
  for r in rows:
    assert r["steps"] == cfg.steps and r["params"] > 0 and r["train_seconds"] > 0
    assert 0 <= r["val_bleu"] <= 100 and 0 <= r["test_bleu"] <= 100
    assert set(r["diagnostics"]) == {"logit_std", "entropy", "saturated", "grad_norm", "max_logit"}
    assert 1.0 <= r["val_ppl"] < 1000
  # The copy task is learnable: BLEU > 0 for every run.
  assert min(r["test_bleu"] for r in rows) > 0
  table = open(os.path.join(workdir, "table.md")).read()
  assert "| dim |" in table and table in proc.stdout
  for d in cfg.dims:
    assert f"| {d} |" in table
  assert "Validation perplexity" in table
  assert "multiplicative − additive" in table and "approximate randomisation" in table
  translations = json.load(open(os.path.join(
      workdir, "runs", f"{cfg.arms[0]}_d{cfg.dims[0]}", "test_translations.json")))
  assert len(translations["hypotheses"]) == cfg.seeds
  assert all(len(h) == len(translations["references"]) == cfg.test_examples
             for h in translations["hypotheses"])
  for name in ["ablation.png", "diagnostics.png", "validation.png"] + [
      f"attention_{a}_{d}.png" for a in cfg.arms for d in cfg.dims]:
    with open(os.path.join(workdir, name), "rb") as f:
      assert f.read(4) == b"\x89PNG", name
  metrics = os.path.join(workdir, "runs", f"{cfg.arms[0]}_d{cfg.dims[0]}", "metrics.jsonl")
  logged = [json.loads(l) for l in open(metrics)]
  diag_steps = sorted({r["step"] for r in logged if "logit_std" in r})
  assert diag_steps == list(range(cfg.diag_every, cfg.steps + 1, cfg.diag_every))
  evals = [r for r in logged if "val_bleu" in r]
  assert sorted({r["step"] for r in evals}) == list(
      range(cfg.eval_every, cfg.steps + 1, cfg.eval_every))
  assert all(1.0 <= r["val_ppl"] < 1000 for r in evals)
  # Re-running a finished sweep trains nothing and changes nothing.
  before = open(os.path.join(workdir, "results.jsonl")).read()
  again = _driver("ablation", "--preset=smoke", f"--workdir={workdir}")
  assert again.returncode == 0
  assert again.stdout.count("finished earlier; skipped") == len(cfg.arms) * len(cfg.dims)
  assert open(os.path.join(workdir, "results.jsonl")).read() == before


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_resume_after_kill_matches_uninterrupted(tmp_path):
  flags = ["--preset=smoke", "--arm=additive", "--dim=8", "--steps=80",
           "--checkpoint_every=20", "--eval_every=40"]
  straight = str(tmp_path / "straight")
  proc = _driver("train", *flags, f"--workdir={straight}")
  assert proc.returncode == 0, proc.stderr[-3000:]

  killed = str(tmp_path / "killed")
  ckpt_dir = os.path.join(killed, "runs", "additive_d8", "checkpoints")
  p = subprocess.Popen([sys.executable, "-m", "experiments.train", *flags,
                        f"--workdir={killed}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while time.time() < deadline and p.poll() is None:
    steps = [d for d in os.listdir(ckpt_dir)] if os.path.isdir(ckpt_dir) else []
    if any(s.isdigit() and int(s) >= 40 for s in steps):
      break
    time.sleep(0.05)
  assert p.poll() is None, "the run finished before it could be killed"
  os.kill(p.pid, signal.SIGKILL)  # mid-step, no clean-up
  p.wait()
  assert not os.path.exists(os.path.join(killed, "results.jsonl")) or not _rows(killed)

  resumed = _driver("train", *flags, f"--workdir={killed}")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed at step" in resumed.stdout
  assert _numbers(_rows(killed)) == _numbers(_rows(straight))
  # The metrics log holds each step once per seed, as the uninterrupted run's does.
  def log(workdir):
    path = os.path.join(workdir, "runs", "additive_d8", "metrics.jsonl")
    return [json.dumps(r, sort_keys=True) for r in map(json.loads, open(path))]
  assert sorted(log(killed)) == sorted(log(straight))


_STOP_FLAGS = ["--preset=smoke", "--arm=additive", "--dim=8", "--steps=80",
               "--checkpoint_every=40", "--eval_every=40", "--log_every=10"]


def _stopped(command, workdir, signum, after="step 10/", group=False):
  """Runs `command` (a driver and its flags) on `workdir`, sends `signum`
  once a line of its output holds `after` (to the driver, or with `group` to
  its whole process group, as a terminal's Ctrl-C does), and returns the
  finished process and its output."""
  p = subprocess.Popen([sys.executable, "-m", *command, f"--workdir={workdir}"], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=group)
  seen = []
  for line in p.stdout:
    seen.append(line)
    if after in line:
      break
  assert p.poll() is None, "the run finished before it could be stopped"
  (os.killpg if group else os.kill)(p.pid, signum)
  out, err = p.communicate(timeout=300)
  return p, "".join(seen) + out, err


def _stop_line(out, signum):
  """The step of the one line saying where the run stopped."""
  name = signal.Signals(signum).name
  lines = [l for l in out.splitlines() if f"{name}: checkpoint saved at step" in l]
  assert len(lines) == 1, out
  return int(lines[0].split("at step ")[1].split(";")[0])


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_ctrl_c_saves_a_checkpoint_after_the_step_and_exits_130_without_a_traceback(
    tmp_path):
  workdir = tmp_path / "w"
  p, out, err = _stopped(["experiments.train", *_STOP_FLAGS], workdir, signal.SIGINT)
  assert p.returncode == 130, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  step = _stop_line(out, signal.SIGINT)
  assert 10 <= step < 80
  ckpt = workdir / "runs" / "additive_d8" / "checkpoints"
  assert str(step) in os.listdir(ckpt)  # saved where it stopped, not at a multiple of 40
  assert (ckpt.parent / "checkpoints_sha256" / f"{step}.json").exists()
  assert not (ckpt.parent / "result.json").exists()


@pytest.mark.slow  # three smoke runs per signal
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_run_stopped_by_a_signal_resumes_there_with_the_numbers_of_an_uninterrupted_one(
    tmp_path, signum):
  straight = str(tmp_path / "straight")
  proc = _driver("train", *_STOP_FLAGS, f"--workdir={straight}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  stopped = str(tmp_path / "stopped")
  p, out, err = _stopped(["experiments.train", *_STOP_FLAGS], stopped, signum)
  assert p.returncode == 128 + signum and "Traceback" not in err, err[-3000:]
  step = _stop_line(out, signum)
  resumed = _driver("train", *_STOP_FLAGS, f"--workdir={stopped}")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed at step {step}" in resumed.stdout
  assert _numbers(_rows(stopped)) == _numbers(_rows(straight))
  def log(workdir):
    path = os.path.join(workdir, "runs", "additive_d8", "metrics.jsonl")
    return sorted(json.dumps(r, sort_keys=True) for r in map(json.loads, open(path)))
  assert log(stopped) == log(straight)


@pytest.mark.slow  # two smoke runs in two worker processes, stopped and resumed
def test_ctrl_c_stops_every_worker_after_its_step_and_a_rerun_resumes_them(tmp_path):
  workdir = str(tmp_path / "w")
  command = ["experiments.ablation", "--preset=smoke", "--arms=additive,multiplicative",
             "--dims=8", "--steps=80", "--checkpoint_every=40", "--eval_every=40",
             "--log_every=10", "--workers=2"]
  # Ctrl-C in a terminal reaches the driver and its workers (one process group).
  p, out, err = _stopped(command, workdir, signal.SIGINT, after="step 10/", group=True)
  assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
  stops = [l for l in out.splitlines() if "checkpoint saved at step" in l]
  assert len(stops) == 2 and {l.split("]")[0] for l in stops} == {
      "[additive d=8", "[multiplicative d=8"}, out
  rerun = _driver("ablation", *command[1:], f"--workdir={workdir}")
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert rerun.stdout.count("resumed at step") == 2
  assert len(_rows(workdir)) == 4


def _worker_pids(driver_pid):
  """The `--workers` processes of a driver: its spawned children, less
  multiprocessing's resource tracker."""
  pids = []
  for pid in os.listdir("/proc"):
    try:
      with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
    except (OSError, ValueError, IndexError):
      continue
    if ppid == driver_pid and b"spawn_main" in cmdline:
      pids.append(int(pid))
  return pids


@pytest.mark.slow  # two smoke runs in two workers, one killed, then resumed (~2 min)
def test_a_killed_worker_is_named_the_other_run_finishes_and_a_rerun_resumes(tmp_path):
  """`kill -9` of a worker (what the out-of-memory killer does) used to leave
  the driver waiting forever with no message and no results."""
  workdir = str(tmp_path / "w")
  flags = ["--preset=smoke", "--arms=additive,multiplicative", "--dims=8", "--steps=200",
           "--eval_every=100", "--diag_every=20", "--checkpoint_every=20", "--log_every=20",
           "--workers=2"]
  p = subprocess.Popen([sys.executable, "-m", "experiments.ablation", *flags,
                        f"--workdir={workdir}"], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  seen, at60 = [], set()
  for line in p.stdout:  # both runs past a checkpoint
    seen.append(line)
    if "step 60/" in line:
      at60.add(line.split("]")[0])
      if len(at60) == 2:
        break
  victims = _worker_pids(p.pid)
  assert len(victims) == 2, victims
  os.kill(victims[0], signal.SIGKILL)
  out, err = p.communicate(timeout=600)
  out = "".join(seen) + out
  assert p.returncode == 1, err[-3000:]
  errors = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
  assert "1 of 2 runs failed: [" in errors[0] and "killed by SIGKILL" in errors[0]
  dead = errors[0].split("failed: [")[1].split(" d=")[0]
  alive = ({"additive", "multiplicative"} - {dead}).pop()
  assert f"[{dead} d=8] failed: its worker process was killed by SIGKILL" in out
  # The other run finished and was reported; the killed one kept its checkpoint.
  assert {r["arm"] for r in _rows(workdir)} == {alive}
  assert os.path.exists(os.path.join(workdir, "table.md"))
  run = os.path.join(workdir, "runs", f"{dead}_d8")
  assert not os.path.exists(os.path.join(run, "result.json"))
  assert os.listdir(os.path.join(run, "checkpoints"))
  rerun = _driver("ablation", *flags, f"--workdir={workdir}")
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert rerun.stdout.count("resumed at step") == 1
  assert f"[{alive} d=8] finished earlier; skipped" in rerun.stdout
  assert len(_rows(workdir)) == 4


@pytest.mark.slow  # about 90 s on 2 cores: in `make test-all`, out of the 10-minute default suite
def test_extending_a_finished_run_gives_the_longer_runs_numbers(tmp_path):
  """A larger --steps on a finished run (constant schedule) continues it from
  its last checkpoint to the numbers a run of that length from scratch gives;
  the shorter run's result is kept aside."""
  flags = ["--preset=smoke", "--arms=additive", "--dims=8", "--eval_every=40",
           "--diag_every=20", "--checkpoint_every=40"]
  straight, extended = str(tmp_path / "straight"), str(tmp_path / "extended")
  proc = _driver("ablation", *flags, "--steps=80", f"--workdir={straight}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  short = _driver("ablation", *flags, "--steps=40", f"--workdir={extended}")
  assert short.returncode == 0, short.stderr[-3000:]
  short_rows = _rows(extended)
  assert {r["steps"] for r in short_rows} == {40}

  longer = _driver("ablation", *flags, "--steps=80", f"--workdir={extended}")
  assert longer.returncode == 0, longer.stderr[-3000:]
  assert "extended from 40 to 80 steps" in longer.stdout
  assert "resumed at step 40" in longer.stdout
  assert {r["steps"] for r in _rows(extended)} == {80}
  assert _numbers(_rows(extended)) == _numbers(_rows(straight))
  run = os.path.join("runs", "additive_d8")
  def log(workdir):
    path = os.path.join(workdir, run, "metrics.jsonl")
    return [json.dumps(r, sort_keys=True) for r in map(json.loads, open(path))]
  assert log(extended) == log(straight)
  with open(os.path.join(extended, run, "result.steps40.json")) as f:
    assert _numbers(json.load(f)) == _numbers(short_rows)

  # Fewer steps, or reports of more steps than the folder holds: refused.
  shorter = _driver("ablation", *flags, "--steps=60", f"--workdir={extended}")
  assert shorter.returncode != 0 and "cannot be shortened" in shorter.stderr
  report = _driver("ablation", *flags, "--steps=120", "--report_only",
                   f"--workdir={extended}")
  assert report.returncode != 0 and "drop --report_only" in report.stderr
  assert {r["steps"] for r in _rows(extended)} == {80}


@pytest.mark.parametrize("old,new,needle", [
    (dict(steps=40), dict(steps=80, schedule="cosine"), "schedule depends"),
    (dict(steps=50), dict(steps=80), "`eval_every` = 40"),
    (dict(steps=40), dict(steps=80, diag_every=30), "`diag_every` = 30"),
    (dict(steps=80), dict(steps=40), "cannot be shortened"),
    (dict(steps=40), dict(steps=80), None),
])
def test_which_runs_can_be_extended(old, new, needle):
  from attention_jax.sweep import workdir as workdir_lib
  base = dict(schedule="constant", eval_every=40, diag_every=20)
  why = workdir_lib.why_not_extended({**base, **old}, {**base, **new})
  assert why is None if needle is None else needle in why


@pytest.mark.slow  # two smoke ablations; kept out of the 10-minute default suite
def test_workers_train_pairs_in_parallel_processes_with_the_same_numbers(tmp_path):
  """`--workers=2` (each pair in its own single-threaded process) gives the
  results of training the pairs one after another in the driver, when the
  driver is single-threaded too. XLA:CPU's thread count is part of the digits
  (a multi-threaded matmul adds in another order): with the driver on both
  cores the same smoke sweep's final max_logit differed in the third digit
  (docs/reproducibility.md), so the comparison fixes the threads."""
  from attention_jax.sweep import workers  # pylint: disable=g-import-not-at-top
  flags = ["--preset=smoke", "--arms=additive,multiplicative", "--dims=8", "--steps=40",
           "--eval_every=20", "--checkpoint_every=20", "--diag_every=20"]
  serial, parallel = str(tmp_path / "serial"), str(tmp_path / "parallel")
  # Added to the inherited flags, as the workers add them.
  one = _driver("ablation", *flags, f"--workdir={serial}",
                env={"XLA_FLAGS": conftest.xla_flags_with(workers.ONE_THREAD_XLA_FLAGS)})
  assert one.returncode == 0, one.stderr[-3000:]
  two = _driver("ablation", *flags, "--workers=2", f"--workdir={parallel}")
  assert two.returncode == 0, two.stderr[-3000:]
  assert len(_rows(parallel)) == 4
  assert _numbers(_rows(parallel)) == _numbers(_rows(serial))
  assert open(os.path.join(parallel, "table.md")).read() == open(
      os.path.join(serial, "table.md")).read()
  # Each row names the thread setting it was trained under.
  assert all(r["provenance"]["xla_flags"].endswith(workers.ONE_THREAD_XLA_FLAGS)
             for r in _rows(parallel))


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
def test_transformer_smoke_preset_end_to_end(tmp_path):
  # The `transformer_smoke` preset (the `transformer` preset's recipe: Adam
  # beta_2 0.98, warm-up, label smoothing, post-LN, scaled_dot baseline) on the
  # copy task, with a score and d_k of one's own as the docs show: additive
  # capped in d_k, so only at the smaller.
  workdir = str(tmp_path / "t")
  proc = _driver("ablation", "--preset=transformer_smoke", "--arms=scaled_dot,additive",
                 "--dims=4,8", "--additive_max_dim=4", "--steps=20", "--warmup_steps=5",
                 "--eval_every=10", "--diag_every=10", "--checkpoint_every=10",
                 f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = _rows(workdir)
  assert {(r["arm"], r["dim"]) for r in rows} == {
      ("scaled_dot", 4), ("scaled_dot", 8), ("additive", 4)}
  assert all(r["model"] == "transformer" and r["steps"] == 20 for r in rows)
  # Every row names the code, versions, device and command that made it.
  from importlib.metadata import version
  for r in rows:
    prov = r["provenance"]
    assert prov["command"].startswith(
        "python -m experiments.ablation --preset=transformer_smoke")
    assert prov["versions"]["flax"] == version("flax") and prov["commit"] and prov["device_kind"]
  config = json.load(open(os.path.join(workdir, "runs", "scaled_dot_d8", "config.json")))
  assert (config["adam_b2"], config["label_smoothing"], config["layer_norm"]) == (0.98, 0.1,
                                                                                    "post")
  diag = rows[0]["diagnostics"]
  for kind in ("encoder_self", "decoder_self", "cross"):
    for stat in ("logit_std", "entropy", "saturated", "max_logit"):
      assert f"{stat}_{kind}_l0" in diag
  table = open(os.path.join(workdir, "table.md")).read()
  assert "additive − scaled_dot" in table  # significance against the preset's baseline
  assert "| 8 |" in table and "–" in table  # additive stops at d_k = 4


# The ablation driver on a TPU VM whose chips cannot be opened (this host's
# PCI bus faked to hold 2 v5e chips, and no libtpu).
_FAKE_TPU_VM = """
import sys
from absl import app
from attention_jax.sweep import workers
from experiments import ablation
workers.tpu_chips = lambda: (2, "v5e")
sys.argv = ["ablation"] + sys.argv[1:]
app.run(ablation.main)
"""


@pytest.mark.slow  # two worker processes start jax (about 20 s on 2 cores)
def test_workers_that_cannot_open_their_tpu_chip_fail_their_runs_instead_of_using_the_cpu(
    tmp_path):
  workdir = str(tmp_path / "w")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run(
      [sys.executable, "-c", _FAKE_TPU_VM, "--preset=smoke", "--arms=additive,multiplicative",
       "--dims=8", "--steps=4", "--eval_every=2", "--checkpoint_every=2", "--workers=2",
       f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 1, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: 2 of 2 runs failed: "), last
  assert last.count("tpu") >= 2  # each run names the backend its worker could not start
  assert not os.path.exists(os.path.join(workdir, "results.jsonl"))
  for run in ("additive_d8", "multiplicative_d8"):
    assert not os.path.exists(os.path.join(workdir, "runs", run, "result.json"))


@pytest.mark.slow  # two smoke ablations of 4 members on 4 host devices each: 556 s on the loaded 2 cores
def test_workers_on_groups_of_devices_give_the_numbers_of_the_runs_on_one_group(tmp_path):
  """8 host devices and `--workers=2`: each worker process sees 4 devices
  and splits its runs' 4 members over them (`--mesh=members`), as a
  process that has those 4 devices alone does, to the same numbers."""
  flags = ["--preset=smoke", "--arms=additive,multiplicative", "--dims=8", "--seeds=4",
           "--steps=20", "--eval_every=10", "--checkpoint_every=10", "--diag_every=10",
           "--mesh=members"]
  groups, alone = str(tmp_path / "groups"), str(tmp_path / "alone")
  two = _driver("ablation", *flags, "--workers=2", f"--workdir={groups}",
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8",
                     "JAX_PLATFORMS": "cpu"})
  assert two.returncode == 0, two.stderr[-3000:]
  one = _driver("ablation", *flags, f"--workdir={alone}",
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                     "JAX_PLATFORMS": "cpu"})
  assert one.returncode == 0, one.stderr[-3000:]
  rows = _rows(groups)
  assert {(r["arm"], r["dim"], r["seed"]) for r in rows} == {
      (arm, 8, seed) for arm in ("additive", "multiplicative") for seed in range(4)}
  assert _numbers(rows) == _numbers(_rows(alone))
  # The workers' runs name the 4 devices each one had.
  assert {r["provenance"]["xla_flags"] for r in rows} == {
      "--xla_force_host_platform_device_count=4"}
  # Too many workers for the devices: one line naming the flag, before any work.
  bad = _driver("ablation", *flags, "--workers=3", f"--workdir={tmp_path / 'bad'}",
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8",
                     "JAX_PLATFORMS": "cpu"})
  assert bad.returncode != 0
  assert bad.stderr.strip().splitlines()[-1].startswith(
      "error: `--workers` = 3 must divide the 8 devices")
  assert not (tmp_path / "bad").exists()
