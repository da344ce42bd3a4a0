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
    (("", "tpu"), "3.10", "Python 3.10 (of "),
    (("", "tpu"), "3.13", "no lock file for Python 3.13"),
])
def test_bootstrap_refuses_a_target_it_has_no_lock_for_with_one_line(tmp_path, args, version,
                                                                     needle):
  venv = _stand_in_venv(tmp_path, version)
  proc = _bootstrap(venv, *args)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1 and needle in err[0], proc.stderr
  if version == "3.10":  # older than requires-python: no unpinned install can work either
    assert "make venv-tpu PYTHON_SYS=python3.12" in err[0] and "LOCK=none" not in err[0]
  if version == "3.13":  # newer: unpinned, for the target asked for (not the CPU venv)
    assert "make venv-tpu PYTHON_SYS=python3.11" in err[0]
    assert "'make venv-tpu LOCK=none'" in err[0]
  assert not (tmp_path / "calls").exists() or _installed(tmp_path) == []


def _system_python(tmp_path, version):
  """A stand-in system Python of `version` on PATH whose `-m venv DIR` makes
  DIR a venv of itself (as a real one would), logging its calls."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  python = bin_dir / f"python{version}"
  python.write_text(
      f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n'
      f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python";'
      f' exit 0; fi\n'
      f'case "$2" in *print*) echo {version} ;; esac\nexit 0\n')
  python.chmod(0o755)
  return python


@pytest.mark.parametrize("target", ["tpu", "cuda", ""])
def test_bootstrap_with_a_tpu_vms_python_310_says_how_to_get_one_and_makes_no_venv(tmp_path,
                                                                                   target):
  """A TPU VM's Python 3.10 left an empty venv (which the next `make` took for
  a built one) and advised `make LOCK=none`, which builds the CPU venv."""
  python = _system_python(tmp_path, "3.10")
  venv = tmp_path / "venv"
  proc = subprocess.run(["bash", "scripts/bootstrap.sh", str(python), str(venv), "", target],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, proc.stderr
  make = f"make venv-{target}" if target else "make"
  assert f"{make} PYTHON_SYS=python3.12" in err[0]
  assert "uv python install 3.12" in err[0] and "deadsnakes" in err[0]
  assert "LOCK=none" not in err[0]
  assert not venv.exists()


# --- make compile-check and its environment (scripts/aot_env.sh) ------------------

def _compile_check_outs(*args, env=None):
  proc = subprocess.run(["make", "-n", "compile-check", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=env)
  assert proc.returncode == 0, proc.stderr
  return re.findall(r"--out=(\S+)", proc.stdout)


def test_make_compile_check_writes_an_ignored_scratch_folder_unless_results_are_named():
  """Cut at 10 minutes, `make compile-check` left results/compile_check/h100.md
  with 5 of 70 rows: the committed tables are written only when named."""
  outs = _compile_check_outs()
  assert len(outs) == 2 and set(outs) == {"runs/compile_check"}, outs
  # Not even an OUT left in the environment moves it: only the command line.
  env = {**os.environ, "OUT": "results/compile_check"}
  assert set(_compile_check_outs(env=env)) == {"runs/compile_check"}
  assert set(_compile_check_outs("OUT=results/compile_check")) == {"results/compile_check"}
  # Everything the target writes is ignored by git, so `git status` stays
  # clean: the tables and rows, the AOT venv, the editable install's metadata.
  written = [f"runs/compile_check/{t}.{ext}" for t in ("h100", "tpu_v5e")
             for ext in ("md", "jsonl", "md.tmp")]
  written += [".venv-aot/.installed-stamp", ".venv-aot/bin/python",
              "attention_jax.egg-info/PKG-INFO"]
  proc = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  assert sorted(proc.stdout.split()) == sorted(written), proc.stdout


def _shim(tmp_path, name, script):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  path = bin_dir / name
  path.write_text("#!/bin/sh\n" + script)
  path.chmod(0o755)
  return bin_dir


@pytest.mark.parametrize("script, said", [
    # a pyenv shim with no 3.12 behind it
    ('echo "pyenv: python3.12: command not found" >&2\nexit 127\n', "does not run"),
    ('case "$2" in *print*) echo 3.11 ;; *) exit 1 ;; esac\n', "is Python 3.11"),
])
def test_aot_env_names_python312_for_a_python_that_will_not_do(tmp_path, script, said):
  bin_dir = _shim(tmp_path, "python3.12", script)
  venv = tmp_path / "aot"
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
  proc = subprocess.run(["bash", "scripts/aot_env.sh", "python3.12", str(venv)], cwd=ROOT,
                        capture_output=True, text=True, timeout=60, env=env)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, proc.stderr
  assert f"'python3.12' {said}" in err[0] and "PYTHON312=" in err[0]
  assert "make compile-check PYTHON312=" in err[0]
  assert not venv.exists()


def test_make_compile_check_passes_python312_to_aot_env():
  proc = subprocess.run(["make", "-n", "compile-check", "PYTHON312=/opt/py/bin/python3.12",
                         "AOT_VENV=/nonexistent/aot"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert 'bash scripts/aot_env.sh "/opt/py/bin/python3.12" "/nonexistent/aot"' in proc.stdout


def test_the_wmt_extra_is_pinned_as_the_bench_extra_is():
  """`.[wmt]` was unpinned (`tensorflow-cpu>=2.16`): each requirement is one
  exact version, and none is a distribution the lock pins at another."""
  extras = _extras()
  cpu = test_lock._lock("cpu-py311.lock.txt")  # pylint: disable=protected-access
  for extra in ("wmt", "bench"):
    for text in extras[extra]:
      req = Requirement(text)
      (spec,) = req.specifier
      assert spec.operator == "==", text
      name = req.name.lower().replace("_", "-")
      assert name not in cpu or cpu[name][0] == spec.version, text
