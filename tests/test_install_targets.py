"""The installs for an accelerator of one's own (docs/gpu_tpu.md): the `cuda` and
`tpu` extras, their lock files (the CPU lock's stack plus the plugin), the
Makefile targets that install them in one command, and scripts/bootstrap.sh
choosing (and, on repair, keeping) the lock of the target a venv was built for."""

import os
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from tests import test_lock

ROOT = test_lock.ROOT
# target -> the packages its extra brings that the CPU lock lacks, at jax's version
PLUGINS = {"cuda": ("jax-cuda13-plugin", "jax-cuda13-pjrt"), "tpu": ()}
TARGET_LOCKS = [(target, python) for target in ("cuda", "tpu") for python in ("3.11", "3.12")]


def _lock_name(target, python):
  return f"{target}-py{python.replace('.', '')}.lock.txt"


def _extras():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["optional-dependencies"]


def test_the_extras_ask_for_jaxs_cuda13_plugin_and_libtpu():
  extras = _extras()
  assert [Requirement(r) for r in extras["cuda"]] == [Requirement("jax[cuda13]")]
  assert [Requirement(r) for r in extras["tpu"]] == [Requirement("jax[tpu]")]


@pytest.mark.parametrize("target,python", TARGET_LOCKS)
def test_a_target_lock_pins_every_requirement_with_hashes(target, python):
  pins = test_lock._lock(_lock_name(target, python))  # pylint: disable=protected-access
  wanted = test_lock._pyproject_requirements() + [  # pylint: disable=protected-access
      Requirement(r) for r in _extras()[target]]
  problems = test_lock.unpinned(pins, wanted)
  assert problems == [], f"requirements/{_lock_name(target, python)} (`make lock`): {problems}"
  assert [name for name, (_, hashes) in pins.items() if not hashes] == []


@pytest.mark.parametrize("target,python", TARGET_LOCKS)
def test_a_target_lock_is_the_cpu_stack_plus_its_plugin_at_jaxs_version(target, python):
  """The accelerator runs the jax, Flax, Optax... the CPU tests passed with;
  the plugin (or libtpu) is the one built for that jax."""
  cpu = test_lock._lock("cpu-py311.lock.txt")  # pylint: disable=protected-access
  pins = test_lock._lock(_lock_name(target, python))  # pylint: disable=protected-access
  moved = {name: (version, pins.get(name, (None,))[0])
           for name, (version, _) in cpu.items() if pins.get(name, (None,))[0] != version}
  assert moved == {}
  jax = pins["jax"][0]
  assert pins["jaxlib"][0] == jax
  for plugin in PLUGINS[target]:
    assert pins[plugin][0] == jax, plugin
  added = set(pins) - set(cpu)
  if target == "cuda":
    assert "nvidia-cudnn-cu13" in added and all(
        name.startswith("nvidia-") or name in PLUGINS["cuda"] for name in added), added
  else:
    assert added == {"libtpu"}


def _targets():
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    return set(re.findall(r"^([A-Za-z][\w.-]*):", f.read(), flags=re.M))


@pytest.mark.parametrize("target", ["cuda", "tpu"])
def test_make_venv_target_installs_its_target_in_one_command(target):
  assert {f"venv-{target}", "ablation-gpu"} <= _targets()
  proc = subprocess.run(["make", "-n", f"venv-{target}", "PYTHON_SYS=python3.11"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert f'bash scripts/bootstrap.sh "python3.11" ".venv" "" {target}' in proc.stdout
  assert "fetch_sword.sh" in proc.stdout  # the corpus's modules come with it


def test_make_ablation_gpu_runs_the_gpu_preset_in_one_go_with_a_calibration_if_named():
  command = ["make", "-n", "-o", ".venv/.installed-stamp", "-o", "sword", "ablation-gpu"]
  proc = subprocess.run(command + ["CALIBRATION=runs/plan/calibration.json"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  run = proc.stdout.replace("\\\n", " ")
  assert "jax.default_backend()" in run  # refuses a venv without a GPU or TPU
  assert re.search(r"-m experiments.ablation --preset=gpu --max_minutes=0 --workdir=runs/gpu"
                   r"\s+--calibration=runs/plan/calibration.json", run), run
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert "--calibration" not in proc.stdout


# --- scripts/bootstrap.sh's choice of lock, with a stand-in venv -------------------

def _stand_in_venv(tmp_path, version="3.11"):
  """A venv whose python reports `version` and logs its pip calls, so that
  the lock bootstrap.sh installs is seen without installing anything."""
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  python = venv / "bin" / "python"
  python.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n'
                    f'if [ "$1" = -c ]; then echo {version}; fi\nexit 0\n')
  python.chmod(0o755)
  return venv


def _bootstrap(venv, *args):
  return subprocess.run(["bash", "scripts/bootstrap.sh", sys.executable, str(venv), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)


def _installed(tmp_path):
  """The lock files the stand-in's pip was asked to install, in order."""
  calls = (tmp_path / "calls").read_text().splitlines()
  return [c.split("-r ")[1] for c in calls if "--require-hashes -r " in c]


@pytest.mark.parametrize("target,version", TARGET_LOCKS)
def test_bootstrap_installs_the_targets_lock_for_the_venvs_python(tmp_path, target, version):
  venv = _stand_in_venv(tmp_path, version)
  proc = _bootstrap(venv, "", target)
  assert proc.returncode == 0, proc.stderr
  lock = f"requirements/{_lock_name(target, version)}"
  assert _installed(tmp_path) == [lock]
  assert (venv / "attention_jax-lock.txt").read_text().split()[0] == lock


def test_bootstrap_without_a_target_keeps_the_lock_the_venv_was_built_from(tmp_path):
  # `make`'s repair of a venv built by `make venv-cuda` reinstalled the CPU lock.
  venv = _stand_in_venv(tmp_path)
  assert _bootstrap(venv, "", "cuda").returncode == 0
  assert _bootstrap(venv).returncode == 0
  assert _installed(tmp_path) == ["requirements/cuda-py311.lock.txt"] * 2
  # A fresh venv (no record of a lock) gets the CPU lock.
  (venv / "attention_jax-lock.txt").unlink()
  assert _bootstrap(venv).returncode == 0
  assert _installed(tmp_path)[-1] == "requirements/cpu-py311.lock.txt"


@pytest.mark.parametrize("args,version,needle", [
    (("", "rocm"), "3.11", "TARGET must be cpu, cuda or tpu, got 'rocm'"),
    (("", "tpu"), "3.10", "no lock file for Python 3.10"),
])
def test_bootstrap_refuses_a_target_it_has_no_lock_for_with_one_line(tmp_path, args, version,
                                                                     needle):
  venv = _stand_in_venv(tmp_path, version)
  proc = _bootstrap(venv, *args)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1 and needle in err[0], proc.stderr
  if args[1] == "tpu":
    assert "make venv-tpu PYTHON_SYS=python3.11" in err[0]
  assert not (tmp_path / "calls").exists() or _installed(tmp_path) == []
