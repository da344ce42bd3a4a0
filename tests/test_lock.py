"""The lock files (requirements/*.lock.txt) agree with pyproject.toml, and a
venv built from one (scripts/bootstrap.sh) still holds its versions."""

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCKS = {"cpu-py311.lock.txt": "3.11", "gpu-image-py312.lock.txt": "3.12"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def parse_lock(text: str, path: str = "lock") -> dict[str, tuple[str, list[str]]]:
  """`{canonical name: (version, sha256 hashes)}` of a pip lock file; a line
  that is neither a pin, a hash, a comment nor blank is an error naming it."""
  pins: dict[str, tuple[str, list[str]]] = {}
  current = None
  for number, line in enumerate(text.splitlines(), 1):
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
      continue
    pin = _PIN.match(line)
    if pin:
      current = canonicalize_name(pin.group(1))
      if current in pins:
        raise ValueError(f"{path}:{number}: {pin.group(1)} pinned twice")
      pins[current] = (pin.group(2), [])
    elif stripped.startswith("--hash=") and current is not None:
      pins[current][1].extend(_HASH.findall(stripped))
    else:
      raise ValueError(f"{path}:{number}: neither an exact pin nor a hash: {stripped!r}")
  return pins


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


@pytest.mark.parametrize("name,python", sorted(LOCKS.items()))
def test_every_pyproject_requirement_is_pinned_within_its_range(name, python):
  pins = _lock(name)
  problems = []
  for req in _pyproject_requirements():
    if not _applies(req, python):
      continue
    pinned = pins.get(canonicalize_name(req.name))
    if pinned is None:
      problems.append(f"{req.name}: not in the lock")
    elif not req.specifier.contains(Version(pinned[0]), prereleases=True):
      problems.append(f"{req.name}: locked {pinned[0]}, pyproject.toml asks {req.specifier}")
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
  test` from a clean clone), every locked version is the one installed."""
  marker = os.path.join(sys.prefix, "attention_jax-lock.txt")
  if not os.path.exists(marker):
    pytest.skip(f"{sys.prefix} was not built from a lock by scripts/bootstrap.sh")
  with open(marker, encoding="utf-8") as f:
    lock_path = f.read().split()[0]
  if not os.path.isabs(lock_path):
    lock_path = os.path.join(ROOT, lock_path)
  with open(lock_path, encoding="utf-8") as f:
    pins = parse_lock(f.read(), lock_path)
  wrong = {}
  for name, (version, _) in pins.items():
    try:
      installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      installed = None
    if installed is None or Version(installed) != Version(version):
      wrong[name] = (version, installed)
  assert wrong == {}, f"locked vs installed in {sys.prefix} (re-run `make`): {wrong}"


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
