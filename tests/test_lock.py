"""The lock files (requirements/*.lock.txt) agree with pyproject.toml, and a
venv built from one (scripts/bootstrap.sh) still holds its versions."""

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCKS = {"cpu-py311.lock.txt": "3.11", "gpu-image-py312.lock.txt": "3.12"}


def _script(name):
  """The module of scripts/<name>.py (the scripts folder is no package)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


check_venv = _script("check_venv")
parse_lock = check_venv.parse_lock  # one parser for the tests and the Makefile's check


def _pyproject_requirements() -> list[Requirement]:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  return [Requirement(r) for r in project["dependencies"]
          + project["optional-dependencies"]["test"]]


def _lock(name):
  path = os.path.join(ROOT, "requirements", name)
  with open(path, encoding="utf-8") as f:
    return parse_lock(f.read(), path)


def _applies(req: Requirement, python: str) -> bool:
  env = {"python_version": python, "python_full_version": f"{python}.0",
         "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
         "extra": ""}
  return req.marker is None or req.marker.evaluate(env)


def test_parse_lock_reads_pins_and_hashes_and_names_bad_lines():
  text = ("# header\nabsl-py==2.5.1 \\\n    --hash=sha256:" + "a" * 64 + " \\\n"
          "    --hash=sha256:" + "b" * 64 + "\n    # via x\nMarkupSafe==3.0.4 \\\n"
          "    --hash=sha256:" + "c" * 64 + "\n")
  assert parse_lock(text) == {"absl-py": ("2.5.1", ["a" * 64, "b" * 64]),
                              "markupsafe": ("3.0.4", ["c" * 64])}
  with pytest.raises(ValueError, match=r"x.txt:2: .*jax>=0.4"):
    parse_lock("# ok\njax>=0.4\n", "x.txt")
  with pytest.raises(ValueError, match="pinned twice"):
    parse_lock("jax==1 \\\n --hash=sha256:" + "a" * 64 + "\njax==2\n")


def unpinned(pins: dict, requirements) -> list[str]:
  """The requirements a lock's `pins` leave out or pin outside their range."""
  problems = []
  for req in requirements:
    pinned = pins.get(canonicalize_name(req.name))
    if pinned is None:
      problems.append(f"{req.name}: not in the lock")
    elif not req.specifier.contains(Version(pinned[0]), prereleases=True):
      problems.append(f"{req.name}: locked {pinned[0]}, pyproject.toml asks {req.specifier}")
  return problems


@pytest.mark.parametrize("name,python", sorted(LOCKS.items()))
def test_every_pyproject_requirement_is_pinned_within_its_range(name, python):
  problems = unpinned(_lock(name), [r for r in _pyproject_requirements() if _applies(r, python)])
  assert problems == [], f"requirements/{name} (run `make lock`): {problems}"


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_pin_has_hashes(name):
  pins = _lock(name)
  assert len(pins) > 20
  assert [n for n, (_, hashes) in pins.items() if not hashes] == []


def test_gpu_image_lock_holds_the_images_versions():
  pins = _lock("gpu-image-py312.lock.txt")
  with open(os.path.join(ROOT, "requirements", "gpu-image-py312.in"), encoding="utf-8") as f:
    wanted = [Requirement(l.split("#")[0].strip()) for l in f if l.split("#")[0].strip()]
  assert {r.name for r in wanted} >= {"jax", "jaxlib"}
  for req in wanted:
    assert req.specifier.contains(pins[canonicalize_name(req.name)][0]), req


def test_this_venv_still_holds_the_lock_it_was_built_from():
  """Where scripts/bootstrap.sh built this venv from a lock (so in CI: `make
  test` from a clean clone), every locked distribution is installed at its
  version with its files (`scripts/check_venv.py`, which `make` runs)."""
  lock_path = check_venv.lock_of(sys.prefix)
  if lock_path is None:
    pytest.skip(f"{sys.prefix} was not built from a lock by scripts/bootstrap.sh")
  with open(lock_path, encoding="utf-8") as f:
    pins = parse_lock(f.read(), lock_path)
  assert check_venv.problems(pins) == {}, (
      f"locked distributions broken in {sys.prefix}: run `make`, which reinstalls them")


# --- scripts/bootstrap.sh ----------------------------------------------------------

def _recording_apt_get(tmp_path):
  """A bin folder whose apt-get only records that it was called."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  apt = bin_dir / "apt-get"
  apt.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt-get.calls'}\n")
  apt.chmod(0o755)
  return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("python", ["python3.99", "/nonexistent/python3", "false"])
def test_bootstrap_names_a_python_that_is_not_there_before_touching_the_system(tmp_path,
                                                                               python):
  # A misspelt Python ran `apt-get update` and installed python3-venv on the
  # system, then failed with "command not found".
  env = _recording_apt_get(tmp_path)
  proc = subprocess.run(["bash", "scripts/bootstrap.sh", python, str(tmp_path / "venv")],
                        cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, proc.stderr
  assert err[0].startswith("error: no Python") and f"'{python}'" in err[0]
  assert "PYTHON_SYS" in err[0]
  assert not (tmp_path / "apt-get.calls").exists() and not (tmp_path / "venv").exists()


# --- scripts/check_venv.py: a venv damaged after it was built ----------------------

def _fake_dist(site, name, version, files):
  """An installed distribution `name` in the folder `site`: its dist-info
  (METADATA, RECORD) and `files` (paths under `site`) written."""
  info = site / f"{name}-{version}.dist-info"
  info.mkdir(parents=True)
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
  for rel in files:
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_text("x = 1\n")
  record = [f"{rel},," for rel in files] + [f"{info.name}/{n},," for n in ("METADATA",
                                                                         "RECORD")]
  (info / "RECORD").write_text("\n".join(record) + "\n")


def _dists(site):
  return {check_venv.canonical(d.metadata["Name"]): d
          for d in importlib.metadata.distributions(path=[str(site)])}


def test_check_venv_finds_files_gone_a_wrong_version_and_a_missing_distribution(tmp_path):
  site = tmp_path / "site-packages"
  _fake_dist(site, "fake_optax", "0.2.5", ["fake_optax/__init__.py", "fake_optax/tree.py",
                                            "fake_optax/__pycache__/tree.cpython-311.pyc"])
  _fake_dist(site, "Other.Pkg", "1.0", ["other_pkg.py"])
  pins = {"fake-optax": ("0.2.5", ["a" * 64]), "other-pkg": ("1.0", ["b" * 64])}
  assert check_venv.problems(pins, _dists(site)) == {}
  # Compiled files come and go: not damage.
  os.remove(site / "fake_optax" / "__pycache__" / "tree.cpython-311.pyc")
  assert check_venv.problems(pins, _dists(site)) == {}
  # The package folder deleted by hand: pip still lists it, the files tell.
  shutil.rmtree(site / "fake_optax")
  pins["missing"] = ("3.0", ["c" * 64])
  pins["other-pkg"] = ("1.1", ["b" * 64])
  assert check_venv.problems(pins, _dists(site)) == {
      "fake-optax": "2 of its files are gone (e.g. fake_optax/__init__.py)",
      "other-pkg": "1.0 installed", "missing": "not installed"}
  assert check_venv.requirements(pins, ["missing", "fake-optax"]) == (
      f"fake-optax==0.2.5 --hash=sha256:{'a' * 64}\nmissing==3.0 --hash=sha256:{'c' * 64}\n")


def _bare_venv(tmp_path):
  """A venv without pip (made in a second), holding one fake distribution."""
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=120)
  site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / (
      "site-packages")
  _fake_dist(site, "fake_optax", "0.2.5", ["fake_optax/__init__.py"])
  lock = tmp_path / "fake.lock.txt"
  lock.write_text("fake-optax==0.2.5 \\\n    --hash=sha256:" + "a" * 64 + "\n")
  (venv / check_venv.MARKER).write_text(f"{lock} {'0' * 64}\n")
  return venv, site


def test_check_venv_run_in_a_venv_names_the_broken_and_writes_their_lock_entries(tmp_path):
  venv, site = _bare_venv(tmp_path)
  command = [str(venv / "bin" / "python"), os.path.join(ROOT, "scripts", "check_venv.py"),
             "--requirements", str(tmp_path / "broken.txt")]
  proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr
  assert (tmp_path / "broken.txt").read_text() == ""
  shutil.rmtree(site / "fake_optax")
  proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 1
  (line,) = proc.stderr.splitlines()
  assert "fake-optax==0.2.5" in line and "1 of its files are gone" in line
  assert (tmp_path / "broken.txt").read_text() == f"fake-optax==0.2.5 --hash=sha256:{'a' * 64}\n"


def test_make_runs_the_venv_rule_when_the_check_finds_it_broken(tmp_path):
  # `make` said "up to date" on a venv with site-packages/optax deleted: its
  # stamp depends only on the lock and pyproject.toml.
  venv, site = _bare_venv(tmp_path)
  stamp = venv / ".installed-stamp"
  stamp.write_text("")  # newer than the lock files and pyproject.toml
  command = ["make", "-n", f"VENV={venv}", str(stamp)]
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and "bootstrap.sh" not in proc.stdout, proc.stdout + proc.stderr
  shutil.rmtree(site / "fake_optax")
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and f'bash scripts/bootstrap.sh "python3" "{venv}"' in proc.stdout
