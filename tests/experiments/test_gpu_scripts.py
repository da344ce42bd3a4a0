"""scripts/gpu_bundle.sh, scripts/gpu_run.sh and scripts/gpu_requirements.py on CPU.

The slow end-to-end test builds a bundle for this machine's Python (network:
PyPI), then plays the GPU machine: a Python started with `-S` sees only a
folder of links to this virtual environment's distributions *minus* the ones
the bundle carries, so anything the bundle forgot fails to import, exactly as
it would there. Each stage then runs at toy size through `gpu_run.sh --toy`.
"""

import importlib.metadata as md
import importlib.util
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_LIST = os.path.join(ROOT, "scripts", "gpu_image_packages.txt")


def _requirements_module():
  spec = importlib.util.spec_from_file_location(
      "gpu_requirements", os.path.join(ROOT, "scripts", "gpu_requirements.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


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
    (["deploy", "OUT"], "STAGE must be check, bench or sweep"),
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


@pytest.mark.slow
def test_bundle_installs_offline_and_every_stage_runs_at_toy_size(tmp_path):
  bundle = tmp_path / "bundle"
  pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
  env = {**os.environ, "PYTHON": sys.executable, "GPU_PYTHON_VERSION": pyver,
         "VOCAB_SIZES": "8000"}
  p = subprocess.run(["bash", "scripts/gpu_bundle.sh", str(bundle)], cwd=ROOT,
                     capture_output=True, text=True, env=env, timeout=1200)
  assert p.returncode == 0, p.stderr[-3000:]
  size_mib = int(p.stdout.strip().splitlines()[-1].split(", ")[1].split()[0])
  assert 0 < size_mib <= 60
  carried = [line.split("==")[0] for line in (bundle / "requirements.txt").read_text().split()]
  assert "tensorflow-datasets" in carried

  farm = tmp_path / "image"
  _image_without(carried, str(farm))
  python = tmp_path / "python"
  python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
  python.chmod(0o755)
  image_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
  image_env.update(PYTHONPATH=str(farm), PYTHON=str(python), GPU_BUNDLE=str(bundle),
                   ATTENTION_JAX_CACHE=str(tmp_path / "empty_cache"))
  # The stand-in image really lacks what the bundle carries.
  p = subprocess.run([str(python), "-c", "import tensorflow_datasets"], env=image_env,
                     capture_output=True, text=True)
  assert p.returncode != 0 and "tensorflow_datasets" in p.stderr

  def stage(name):
    out = tmp_path / f"out_{name}"
    p = subprocess.run(["bash", "scripts/gpu_run.sh", "--toy", name, str(out)], cwd=ROOT,
                       capture_output=True, text=True, env=image_env, timeout=1200)
    assert p.returncode == 0, (name, p.stdout[-3000:], p.stderr[-3000:])
    files = sorted(os.listdir(out))
    assert len(files) <= 8 and all(os.path.isfile(out / f) for f in files)
    assert "backend cpu" in (out / "device.txt").read_text()
    return out, p.stdout

  out, stdout = stage("check")
  assert "skipped" in stdout and "failed" not in stdout
  out, _ = stage("bench")
  assert (out / "benchmark.jsonl").stat().st_size > 0 and (out / "benchmark.md").exists()
  with tarfile.open(out / "plots.tar.gz") as t:
    assert any(n.endswith(".png") for n in t.getnames())
  out, _ = stage("sweep")
  rows = (out / "results.jsonl").read_text().splitlines()
  assert len(rows) == 2 * 2 * 2  # arms x dims x seeds
  assert "perplexity" in (out / "table.md").read_text().lower()
  # the same command again finds every run finished and trains nothing
  out, stdout = stage("sweep")
  assert len((out / "results.jsonl").read_text().splitlines()) == 8
  assert "step 3/" not in stdout
