"""scripts/gpu_bundle.sh, scripts/gpu_run.sh and scripts/gpu_requirements.py on CPU.

The slow end-to-end test builds a bundle for this machine's Python (network:
PyPI), then plays the GPU machine: a Python started with `-S` sees only a
folder of links to this virtual environment's distributions *minus* the ones
the bundle carries, so anything the bundle forgot fails to import, exactly as
it would there. Each stage then runs at toy size through `gpu_run.sh --toy`.
"""

import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_LIST = os.path.join(ROOT, "scripts", "gpu_image_packages.txt")


def _script_module(name):
  """scripts/NAME.py loaded as a module (scripts/ is not a package)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _requirements_module():
  return _script_module("gpu_requirements")


def test_requirements_are_the_closure_of_what_the_image_lacks():
  req = _requirements_module()
  image = req.read_image_packages(IMAGE_LIST)
  assert {"jax", "flax", "optax", "orbax-checkpoint", "sacrebleu"} <= image
  missing = req.missing("attention_jax", image)
  assert {"tensorflow-datasets", "array-record"} <= set(missing)
  assert not set(missing) & image
  for name, version in missing.items():
    assert md.version(name) == version
    # closed: every requirement of a carried distribution is carried or in the image
    for spec in md.requires(name) or ():
      r = req.Requirement(spec)
      if r.marker is None or r.marker.evaluate({**req.default_environment(),
                                                "python_version": "3.12", "extra": ""}):
        assert req.canonical(r.name) in image or req.canonical(r.name) in missing, (name, r)
  # an image with everything needs nothing
  assert req.missing("attention_jax", image | set(missing)) == {}


@pytest.mark.parametrize("args,needle", [
    (["deploy", "OUT"], "STAGE must be check, bench, calibrate or sweep"),
    (["check"], "usage:"),
    (["check", "OUT", "--suite=x"], "unexpected argument '--suite=x'"),
    (["check", "OUT"], "no bundle at"),
])
def test_gpu_run_rejects_bad_arguments_with_one_line(tmp_path, args, needle):
  args = [str(tmp_path / a) if a == "OUT" else a for a in args]
  env = {**os.environ, "GPU_BUNDLE": str(tmp_path / "nowhere")}
  p = subprocess.run(["bash", "scripts/gpu_run.sh", *args], cwd=ROOT, capture_output=True,
                     text=True, env=env)
  assert p.returncode == 2
  assert needle in p.stderr and p.stderr.count("\n") == 1, p.stderr
  assert not os.listdir(tmp_path)  # nothing created before the arguments are checked


def test_gpu_bundle_rejects_a_bad_python_version(tmp_path):
  p = subprocess.run(["bash", "scripts/gpu_bundle.sh", str(tmp_path / "b")], cwd=ROOT,
                     capture_output=True, text=True,
                     env={**os.environ, "PYTHON": sys.executable,
                          "GPU_PYTHON_VERSION": "twelve"})
  assert p.returncode == 1 and "GPU_PYTHON_VERSION" in p.stderr
  assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


# The default GPU bundle (`bash scripts/gpu_bundle.sh`, VOCAB_SIZES "2000 8000"):
# 29 MiB (9.6 MiB of wheels, 19 MiB of prepared data) at a5aceec on the 2-core Xeon.
BUNDLE_MIB = 29
CALL_LIMIT_MIB, STATE_RESERVE_MIB = 64, 8  # scripts/gpu_bundle.sh's


def test_the_tree_that_travels_leaves_room_for_the_gpu_bundle():
  # The committed tree grew to 28 MiB with a grid's results, and the bundle no
  # longer fitted a device call: only the slow end-to-end test (and a lent GPU
  # session, refused before any work) would have said so.
  with open(os.path.join(ROOT, "scripts", "gpu_bundle.sh")) as f:
    script = f.read()
  assert (f"call_limit_mib={CALL_LIMIT_MIB}\n" in script
          and f"${{STATE_RESERVE_MIB:-{STATE_RESERVE_MIB}}}" in script)
  listed = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                          cwd=ROOT, capture_output=True, check=True).stdout
  paths = [os.path.join(ROOT, p) for p in listed.decode().split("\0") if p]
  tree_mib = sum(os.lstat(p).st_size for p in paths if os.path.lexists(p)) / 2**20
  assert tree_mib + BUNDLE_MIB + STATE_RESERVE_MIB <= CALL_LIMIT_MIB, (
      f"the working tree is {tree_mib:.1f} MiB: with the {BUNDLE_MIB} MiB GPU bundle and "
      f"the {STATE_RESERVE_MIB} MiB state reserve it is over a device call's "
      f"{CALL_LIMIT_MIB} MiB; keep bulky results compressed (as test_translations.json.gz)")


def _image_without(carried, farm):
  """Links every distribution of this environment except `carried` into `farm`."""
  os.makedirs(farm)
  skip = set(carried) | {"attention-jax"}
  req = _requirements_module()
  for dist in md.distributions():
    if req.canonical(dist.metadata["Name"]) in skip:
      continue
    tops = {str(f).split("/")[0] for f in dist.files or () if not str(f).startswith("..")}
    for top in tops:
      src = os.path.join(str(dist.locate_file("")), top)
      dst = os.path.join(farm, top)
      if os.path.exists(src) and not os.path.lexists(dst) and not top.endswith(".pth"):
        os.symlink(src, dst)


# What each stage brings back through the device's $OUT (at most 8 files).
STAGE_FILES = {
    "check": ["check.log", "check.xml", "device.txt", "run.log"],
    "bench": ["benchmark.jsonl", "benchmark.md", "device.txt", "plots.tar.gz", "run.log"],
    "calibrate": ["calibration.json", "calibration.md", "device.txt", "run.log"],
    "sweep": ["ablation.png", "device.txt", "plots.tar.gz", "results.jsonl", "run.log",
              "sweep_state.tar.gz", "table.md"],
}


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the bundle and seven stages: ~25 minutes on a shared 2-core CPU
def test_bundle_installs_offline_and_the_documented_session_runs_at_toy_size(tmp_path):
  """The dry run of docs/gpu_tpu.md's GPU session: the same calls in the same
  order, at toy size, on a stand-in for the GPU image, each under its stage
  limit, bringing back every file the real session would; what a call brings
  back is carried into the next as runs/gpu_state would be."""
  bundle = tmp_path / "bundle"
  pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
  env = {**os.environ, "PYTHON": sys.executable, "GPU_PYTHON_VERSION": pyver,
         "VOCAB_SIZES": "8000"}
  p = subprocess.run(["bash", "scripts/gpu_bundle.sh", str(bundle)], cwd=ROOT,
                     capture_output=True, text=True, env=env, timeout=1800)
  assert p.returncode == 0, p.stderr[-3000:]
  last = p.stdout.strip().splitlines()
  size_mib = int(last[-1].split(", ")[1].split()[0])
  tree, total = last[-2].split(" + ")[0], last[-2].split("<= ")[1]
  assert 0 < size_mib and total == "64 MiB per device call", last[-2:]
  assert int(tree.split()[-2]) + size_mib + 8 <= 64  # the tree, the bundle, the state reserve
  carried = [line.split("==")[0] for line in (bundle / "requirements.txt").read_text().split()]
  assert "tensorflow-datasets" in carried
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                        text=True, check=True).stdout.strip()
  assert (bundle / "COMMIT").read_text().strip() in (head, head + "-dirty")  # rows' commit there

  farm = tmp_path / "image"
  _image_without(carried, str(farm))
  python = tmp_path / "python"
  python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
  python.chmod(0o755)
  state = tmp_path / "state"  # runs/gpu_state of the documented session
  image_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
  image_env.update(PYTHONPATH=str(farm), PYTHON=str(python), GPU_BUNDLE=str(bundle),
                   ATTENTION_JAX_CACHE=str(tmp_path / "empty_cache"),
                   GPU_RUNS=str(tmp_path / "machine1"), GPU_STATE=str(state))
  # The stand-in image really lacks what the bundle carries.
  p = subprocess.run([str(python), "-c", "import tensorflow_datasets"], env=image_env,
                     capture_output=True, text=True)
  assert p.returncode != 0 and "tensorflow_datasets" in p.stderr

  def stage(name, tag, ok=(0,), **env):
    out = tmp_path / f"out_{tag}"
    start = time.monotonic()
    p = subprocess.run(["bash", "scripts/gpu_run.sh", "--toy", name, str(out)], cwd=ROOT,
                       capture_output=True, text=True, env={**image_env, **env}, timeout=1200)
    assert p.returncode in ok, (name, p.stdout[-3000:], p.stderr[-3000:])
    assert time.monotonic() - start < 8 * 60 + 90  # the stage limit, set-up and collection
    assert sorted(os.listdir(out)) == STAGE_FILES[name]  # <= 8 plain files, as documented
    assert "backend cpu" in (out / "device.txt").read_text()
    assert "versions: jax " in (out / "device.txt").read_text()
    return out, p.stdout, p.returncode

  out, stdout, _ = stage("check", "check")
  assert "skipped" in stdout and "failed" not in stdout
  out, _, _ = stage("bench", "bench")
  rows = (out / "benchmark.jsonl").read_text().splitlines()
  assert rows and (out / "benchmark.md").exists()
  with tarfile.open(out / "plots.tar.gz") as t:
    assert any(n.endswith(".png") for n in t.getnames())
  # A second bench call (the same machine) finds every case measured.
  out, stdout, _ = stage("bench", "bench2")
  assert "appended 0 rows" in stdout and len((out / "benchmark.jsonl").read_text().splitlines()) == len(rows)
  out, _, _ = stage("calibrate", "calibrate")
  calibration = json.loads((out / "calibration.json").read_text())
  plan = calibration["plan"]
  assert {"commit", "versions", "device_kind", "command"} <= set(calibration["provenance"])
  assert plan["fits"] and plan["flags"] == ["--steps=6", "--eval_every=3", "--dims=8,16"]
  state.mkdir()
  shutil.copy(out / "calibration.json", state)
  # Sweep pieces as documented: each on a fresh machine (the worst case), the
  # state brought back carried into the next, until a call ends complete. A
  # loaded 2-core CPU compiles the toy cells for minutes, so a piece may end at
  # its --max_minutes (75) or its limit (killed: 124 / 137) with its finished
  # cells and the cut cell's checkpoint kept.
  finished = 0
  for piece in range(1, 4):
    out, stdout, rc = stage("sweep", f"sweep{piece}", ok=(0, 75, 124, 137),
                            GPU_RUNS=str(tmp_path / f"machine_sweep{piece}"))
    assert "plan from" in stdout
    rows = (out / "results.jsonl").read_text().splitlines() if (out / "results.jsonl").exists() else []
    assert len(rows) >= finished  # nothing finished is lost
    assert stdout.count("finished earlier; skipped") == finished // 2
    finished = len(rows)
    shutil.copy(out / "sweep_state.tar.gz", state)
    if rc == 0:
      break
  assert rc == 0 and finished == 2 * 2 * 2  # arms x dims x seeds
  assert "perplexity" in (out / "table.md").read_text().lower()
  # One more fresh machine with the state carried back: every cell finished, nothing trained.
  out, stdout, _ = stage("sweep", "sweep_fresh", GPU_RUNS=str(tmp_path / "machine_last"))
  assert len((out / "results.jsonl").read_text().splitlines()) == 8
  assert "step 3/" not in stdout and stdout.count("finished earlier; skipped") == 4


# --- gpu_run.sh's stage limit, collection and state, with a stand-in Python ---

# Answers each command gpu_run.sh gives the image's Python: the stage commands
# write what the real ones would write first, then hang until the stage limit
# kills them; anything else goes to this environment's Python.
FAKE_PYTHON = r"""#!/bin/bash
wd=""
for a in "$@"; do case "$a" in --workdir=*) wd="${a#--workdir=}" ;; esac; done
case "$*" in
  "-m pip install"*) exit 0 ;;
  *gpu_versions.py*) echo "versions: stand-in"; exit 0 ;;
  "-") cat > /dev/null; echo "backend cpu (stand-in)"; exit 0 ;;
  *"-m experiments.kernels.run"*--report_only*) echo "# report of the rows on disk" > "$wd/benchmark.md"; exit 0 ;;
  *"-m experiments.kernels.run"*)
    echo "args: $*"
    echo '{"suite": "kernels", "impl": "scaled_dot", "status": "ok"}' >> "$wd/benchmark.jsonl"
    echo png > "$wd/kernels_fwd.png"
    [ -n "${FAKE_EXIT:-}" ] && { echo "# its own report" > "$wd/benchmark.md"; exit "$FAKE_EXIT"; }
    exec sleep 60 ;;
  *"-m experiments.ablation"*)
    echo "args: $*"
    [ -f "$wd/runs/additive_d8/result.json" ] && echo "found the finished cell"
    cut="$wd/runs/multiplicative_d8"
    [ -f "$cut/checkpoints/4/arrays/data" ] && [ -f "$cut/checkpoints_sha256/4.json" ] \
      && echo "found the cut cell's checkpoint"
    mkdir -p "$wd/runs/additive_d8/checkpoints" "$cut/checkpoints/2" "$cut/checkpoints/4/arrays" \
      "$cut/checkpoints_sha256"
    echo '[{"arm": "additive"}]' > "$wd/runs/additive_d8/result.json"
    echo "weights" > "$wd/runs/additive_d8/checkpoints/state.bin"
    echo "step 2" > "$cut/checkpoints/2/data"; echo "{}" > "$cut/checkpoints_sha256/2.json"
    head -c "${FAKE_CHECKPOINT_BYTES:-100}" /dev/urandom > "$cut/checkpoints/4/arrays/data"
    echo "{}" > "$cut/checkpoints_sha256/4.json"
    echo '{"arm": "additive"}' > "$wd/results.jsonl"
    echo "| table |" > "$wd/table.md"
    echo png > "$wd/ablation.png"; echo png > "$wd/validation.png"
    [ -n "${FAKE_EXIT:-}" ] && exit "$FAKE_EXIT"
    exec sleep 60 ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


# The stand-in's stage commands write their files at once, then hang: a limit
# of 2 s (gpu_run.sh rounds minutes * 60 down to whole seconds) cuts them.
STAGE_MINUTES = "0.034"


def _stand_in(tmp_path, **env):
  bundle = tmp_path / "bundle"
  (bundle / "wheels").mkdir(parents=True)
  (bundle / "wheels" / "stand_in-0-py3-none-any.whl").write_text("not a wheel")
  subprocess.run("sha256sum wheels/* > SHA256SUMS", shell=True, cwd=bundle, check=True)
  python = tmp_path / "python"
  python.write_text(FAKE_PYTHON)
  python.chmod(0o755)
  return {**os.environ, "PYTHON": str(python), "REAL_PYTHON": sys.executable,
          "GPU_BUNDLE": str(bundle), "GPU_RUNS": str(tmp_path / "runs"),
          "GPU_STATE": str(tmp_path / "state"), "STAGE_MINUTES": STAGE_MINUTES, **env}


def _stage(env, stage, out):
  start = time.monotonic()
  p = subprocess.run(["bash", "scripts/gpu_run.sh", stage, str(out)], cwd=ROOT,
                     capture_output=True, text=True, env=env, timeout=120)
  return p, time.monotonic() - start


def test_a_bench_stage_killed_by_its_limit_still_brings_back_its_files(tmp_path):
  env = _stand_in(tmp_path)
  p, seconds = _stage(env, "bench", tmp_path / "out")
  assert p.returncode == 124, (p.stdout, p.stderr)  # timeout's status: killed at the limit
  assert seconds < 30  # the 60-second hang was cut at 2 s
  out = tmp_path / "out"
  assert sorted(os.listdir(out)) == ["benchmark.jsonl", "benchmark.md", "device.txt",
                                     "plots.tar.gz", "run.log"]
  assert '"impl": "scaled_dot"' in (out / "benchmark.jsonl").read_text()  # the partial rows
  assert "report of the rows on disk" in (out / "benchmark.md").read_text()
  with tarfile.open(out / "plots.tar.gz") as t:
    assert [os.path.basename(n) for n in t.getnames()] == ["kernels_fwd.png"]
  log = (out / "run.log").read_text()
  assert f"stopped by its limit of {STAGE_MINUTES} minutes" in log and "--max_minutes=6.5" in log
  assert "--preset=gpu_headline" in log


def test_a_fresh_machine_resumes_the_benchmark_from_the_rows_carried_back(tmp_path):
  env = _stand_in(tmp_path)
  (tmp_path / "state").mkdir()
  (tmp_path / "state" / "benchmark.jsonl").write_text('{"impl": "earlier"}\n')
  p, _ = _stage(env, "bench", tmp_path / "out")
  assert p.returncode == 124
  rows = (tmp_path / "out" / "benchmark.jsonl").read_text().splitlines()
  assert rows[0] == '{"impl": "earlier"}' and len(rows) == 2


def test_a_killed_sweep_piece_returns_its_state_and_a_fresh_machine_resumes_from_it(tmp_path):
  env = _stand_in(tmp_path)
  p, _ = _stage(env, "sweep", tmp_path / "out1")
  assert p.returncode == 124, p.stderr
  out = tmp_path / "out1"
  assert sorted(os.listdir(out)) == ["ablation.png", "device.txt", "plots.tar.gz",
                                     "results.jsonl", "run.log", "sweep_state.tar.gz",
                                     "table.md"]
  with tarfile.open(out / "plots.tar.gz") as t:
    assert [os.path.basename(n) for n in t.getnames()] == ["validation.png"]
  with tarfile.open(out / "sweep_state.tar.gz") as t:
    names = t.getnames()
  assert "./runs/additive_d8/result.json" in names
  # A finished cell's weights stay behind; the cut cell's newest step comes back.
  assert [n for n in names if "checkpoints" in n] == [
      "./runs/multiplicative_d8/checkpoints/4/arrays/data",
      "./runs/multiplicative_d8/checkpoints_sha256/4.json"]
  assert "found the finished cell" not in (out / "run.log").read_text()
  # Another machine: nothing under GPU_RUNS, the state and a calibration carried back.
  state = tmp_path / "state"
  state.mkdir()
  shutil.copy(out / "sweep_state.tar.gz", state)
  (state / "calibration.json").write_text(json.dumps({"plan": {
      "fits": True, "steps": 1500, "dims": [128, 1024],
      "flags": ["--steps=1500", "--eval_every=500", "--dims=128,1024"]}}))
  p, _ = _stage({**env, "GPU_RUNS": str(tmp_path / "runs2")}, "sweep", tmp_path / "out2")
  assert p.returncode == 124
  log = (tmp_path / "out2" / "run.log").read_text()
  assert "found the finished cell" in log and "found the cut cell's checkpoint" in log
  assert "--max_minutes=7 --steps=1500 --eval_every=500 --dims=128,1024" in log
  # A plan that does not fit stops the call before any work, with one line.
  (state / "calibration.json").write_text(json.dumps({"plan": {
      "fits": False, "steps": 0, "dims": [128, 1024], "flags": []}}))
  p, _ = _stage(env, "sweep", tmp_path / "out3")
  assert p.returncode == 2 and p.stderr.count("\n") == 1 and "does not fit" in p.stderr
  assert not (tmp_path / "out3" / "run.log").exists()


def test_a_sweep_of_another_preset_runs_it_unchanged_in_its_own_workdir(tmp_path):
  # The quick table's recipe on the GPU: no plan sized for the gpu preset applies to it.
  env = _stand_in(tmp_path, FAKE_EXIT="0", SWEEP_PRESET="quick")
  (tmp_path / "state").mkdir()
  (tmp_path / "state" / "calibration.json").write_text(json.dumps({"preset": "gpu", "plan": {
      "fits": True, "steps": 1500, "dims": [128], "flags": ["--steps=1500", "--dims=128"]}}))
  p, _ = _stage(env, "sweep", tmp_path / "out")
  assert p.returncode == 0, (p.stdout, p.stderr)
  log = (tmp_path / "out" / "run.log").read_text()
  assert "another preset's plan: --preset=quick runs as the preset says" in log
  assert "--preset=quick --max_minutes=7 --workdir=" + str(tmp_path / "runs" / "gpu_quick") in log
  assert "--steps=1500" not in log
  assert (tmp_path / "runs" / "gpu_quick" / "results.jsonl").exists()
  # Its own calibration's plan would apply (a calibration names its preset).
  (tmp_path / "state" / "calibration.json").write_text(json.dumps({"preset": "quick", "plan": {
      "fits": True, "steps": 1500, "dims": [128], "flags": ["--steps=1500"]}}))
  p, _ = _stage(env, "sweep", tmp_path / "out2")
  assert "--preset=quick --max_minutes=7 --steps=1500" in (tmp_path / "out2" / "run.log").read_text()
  p, _ = _stage({**env, "SWEEP_PRESET": "../x"}, "sweep", tmp_path / "out3")
  assert p.returncode == 2 and p.stderr.count("\n") == 1 and "SWEEP_PRESET" in p.stderr


@pytest.mark.parametrize("stage", ["bench", "sweep"])
def test_a_stage_stopped_by_its_max_minutes_exits_75_and_keeps_everything(tmp_path, stage):
  # Its driver stopped at --max_minutes (exit 75, nothing lost): the stage said
  # 0, as if complete, and a script could not tell it should call again.
  env = _stand_in(tmp_path, FAKE_EXIT="75")
  p, seconds = _stage(env, stage, tmp_path / "out")
  assert p.returncode == 75 and seconds < 30, (p.stdout, p.stderr)
  out = tmp_path / "out"
  log = (out / "run.log").read_text()
  assert "stopped by its --max_minutes with everything kept (exit 75)" in log
  assert "STAGE_MINUTES" not in log
  if stage == "bench":  # its own report is kept, not rewritten as after a kill
    assert (out / "benchmark.md").read_text() == "# its own report\n"
    assert "--report_only" not in log
  else:
    with tarfile.open(out / "sweep_state.tar.gz") as t:
      assert "./runs/multiplicative_d8/checkpoints/4/arrays/data" in t.getnames()
  # A failure is still a failure.
  env = _stand_in(tmp_path / "second", FAKE_EXIT="1")
  p, _ = _stage(env, stage, tmp_path / "out_failed")
  assert p.returncode == 1
  assert "everything kept" not in (tmp_path / "out_failed" / "run.log").read_text()


def test_checkpoints_over_the_state_limit_are_left_out_and_said_so(tmp_path):
  # 2 MiB of random weights: over SWEEP_STATE_MIB=1, the archive is made without them.
  env = _stand_in(tmp_path, FAKE_EXIT="75", FAKE_CHECKPOINT_BYTES=str(2 << 20),
                  SWEEP_STATE_MIB="1")
  p, _ = _stage(env, "sweep", tmp_path / "out")
  assert p.returncode == 75, p.stderr
  with tarfile.open(tmp_path / "out" / "sweep_state.tar.gz") as t:
    names = t.getnames()
  assert "./runs/additive_d8/result.json" in names
  assert not any("checkpoints" in n for n in names)
  assert os.path.getsize(tmp_path / "out" / "sweep_state.tar.gz") < 1 << 20
  log = (tmp_path / "out" / "run.log").read_text()
  assert "over SWEEP_STATE_MIB=1" in log and "start again from step 0" in log


@pytest.mark.parametrize("name,value", [("STAGE_MINUTES", "0"), ("BENCH_MINUTES", "soon"),
                                        ("SWEEP_MINUTES", "-1"), ("SWEEP_STATE_MIB", "6.5")])
def test_gpu_run_rejects_bad_minutes_with_one_line(tmp_path, name, value):
  env = _stand_in(tmp_path, **{name: value})
  p, _ = _stage(env, "bench", tmp_path / "out")
  assert p.returncode == 2 and p.stderr.count("\n") == 1 and name in p.stderr, p.stderr
  assert not (tmp_path / "out").exists()


# --- scripts/gpu_versions.py: the image's versions against the bundle's needs ---

def _versions_module():
  return _script_module("gpu_versions")


def _fake_site(site, name, requires):
  info = site / f"{name.replace('-', '_')}-1.0.dist-info"
  info.mkdir(parents=True)
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n" +
                                 "".join(f"Requires-Dist: {r}\n" for r in requires))
  return site


def test_versions_pass_for_this_environment_and_print_one_line(tmp_path):
  p = subprocess.run([sys.executable, "scripts/gpu_versions.py", str(tmp_path),
                      "pyproject.toml"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  line, = p.stdout.splitlines()
  assert line.startswith("versions: jax ") and f"flax {md.version('flax')}" in line
  assert f"protobuf {md.version('protobuf')}" in line and "orbax-checkpoint" in line


def test_versions_name_every_requirement_the_image_breaks_in_one_line(tmp_path):
  site = _fake_site(tmp_path / "site", "carried-thing", ["optax>=99", "flax<0.1",
                                                         "no-such-dist-xyz>=1"])
  p = subprocess.run([sys.executable, "scripts/gpu_versions.py", str(site), "pyproject.toml"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and p.stdout == ""
  assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ")
  for needle in (f"the image has optax {md.version('optax')}, carried-thing 1.0 (carried) "
                 "needs optax>=99", "needs flax<0.1", "no-such-dist-xyz is missing"):
    assert needle in p.stderr, p.stderr


def test_versions_refuse_an_old_protobuf_for_the_carried_tensorflow_metadata(monkeypatch):
  versions = _versions_module()
  monkeypatch.setattr(versions, "installed", lambda name, path=None: "5.29.4")
  problems = versions.undeclared({"tensorflow-metadata"})
  assert len(problems) == 1 and "protobuf 5.29.4" in problems[0] and ">=6.31" in problems[0]
  assert versions.undeclared({"something-else"}) == []  # not carried: the image's own pair
  monkeypatch.setattr(versions, "installed", lambda name, path=None: "6.31.1")
  assert versions.undeclared({"tensorflow-metadata"}) == []


@pytest.mark.parametrize("args,needle", [([], "usage"), (["/nonexistent", "pyproject.toml"],
                                                          "SITE '/nonexistent' is not a folder")])
def test_versions_reject_bad_arguments_with_one_line(args, needle):
  p = subprocess.run([sys.executable, "scripts/gpu_versions.py", *args], cwd=ROOT,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and needle in p.stderr and p.stderr.count("\n") == 1


_FAKE_STAGE = """\
#!/usr/bin/env bash
# Stand-in for gpu_run.sh: STAGE OUTDIR [-- FLAGS]; writes what it was given.
mkdir -p "$2"; echo "$STAGE_MINUTES $*" > "$2/args.txt"
case "$1" in check) exit 0 ;; bench) exit 75 ;; calibrate) exit 3 ;; esac
"""


def test_gpu_stages_runs_each_stage_and_packs_what_they_wrote(tmp_path):
  fake = tmp_path / "fake_run.sh"
  fake.write_text(_FAKE_STAGE)
  env = {**os.environ, "GPU_RUN": str(fake), "FLAGS_extra": "--suite=additive --x=1"}
  out = tmp_path / "out"
  p = subprocess.run(["bash", "scripts/gpu_stages.sh", str(out), "check:1.5", "bench:2:extra"],
                     cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
  assert p.returncode == 0, p.stderr  # 0 and 75 (stopped by its own budget) are fine
  with tarfile.open(out / "stages.tar.gz") as tar:
    args = {m.name: tar.extractfile(m).read().decode().split()
            for m in tar.getmembers() if m.name.endswith("args.txt")}
  assert args["./check/args.txt"][:2] == ["1.5", "check"]
  assert args["./extra/args.txt"][:2] == ["2", "bench"]
  assert args["./extra/args.txt"][-3:] == ["--", "--suite=additive", "--x=1"]
  summary = (out / "summary.txt").read_text()
  assert "== check (check, limit 1.5 min): exit 0" in summary
  assert "== extra (bench, limit 2 min): exit 75" in summary
  p = subprocess.run(["bash", "scripts/gpu_stages.sh", str(out), "calibrate:1"], cwd=ROOT,
                     capture_output=True, text=True, env=env, timeout=60)
  assert p.returncode == 1 and "exit 3" in p.stdout


@pytest.mark.parametrize("spec,needle", [("deploy:1", "STAGE must be check"),
                                         ("check:soon", "MINUTES must be a number"),
                                         ("check:1:a-b", "NAME must be letters")])
def test_gpu_stages_rejects_a_bad_spec_before_any_stage(tmp_path, spec, needle):
  fake = tmp_path / "fake_run.sh"
  fake.write_text(_FAKE_STAGE)
  p = subprocess.run(["bash", "scripts/gpu_stages.sh", str(tmp_path / "out"), "check:1", spec],
                     cwd=ROOT, capture_output=True, text=True, timeout=60,
                     env={**os.environ, "GPU_RUN": str(fake)})
  assert p.returncode == 2 and needle in p.stderr and len(p.stderr.splitlines()) == 1
  assert not (tmp_path / "out" / "summary.txt").exists()  # nothing ran


@pytest.mark.parametrize("timeout_s,ok", [(600, True), (479, False)])
def test_gpu_stages_refuse_limits_that_do_not_fit_the_device_command(tmp_path, timeout_s, ok):
  """Two stages of 2.5 and 3 min: 150 + 180 s, 20 s to SIGKILL and 40 s of
  set-up each = 450 s, which fits a 600 s command with its minute to spare and
  not a 479 s one (450 > 419)."""
  fake = tmp_path / "fake_run.sh"
  fake.write_text(_FAKE_STAGE)
  out = tmp_path / "out"
  p = subprocess.run(["bash", "scripts/gpu_stages.sh", str(out), "check:2.5", "check:3:again"],
                     cwd=ROOT, capture_output=True, text=True, timeout=60,
                     env={**os.environ, "GPU_RUN": str(fake),
                          "GPU_COMMAND_SECONDS": str(timeout_s)})
  if ok:
    assert p.returncode == 0, p.stderr
    assert "exit 0" in (out / "summary.txt").read_text()
  else:
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1
    assert "need up to 450 s" in p.stderr and "GPU_COMMAND_SECONDS=479" in p.stderr
    assert not (out / "summary.txt").exists()  # nothing ran
