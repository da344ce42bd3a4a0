"""A driver run with a Python that lacks the project's dependencies (a
forgotten `source .venv/bin/activate`) says so in one line."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


def _without_jax() -> str:
  """The system's Python, where it has no jax; skips the test otherwise."""
  if not os.path.exists(SYSTEM_PYTHON):
    pytest.skip(f"no {SYSTEM_PYTHON} on this machine to stand for a Python without the venv")
  has_jax = subprocess.run(
      [SYSTEM_PYTHON, "-c", "import importlib.util, sys; "
       "sys.exit(importlib.util.find_spec('jax') is None)"],
      capture_output=True, env=_plain_env(), check=False).returncode == 0
  if has_jax:
    pytest.skip(f"{SYSTEM_PYTHON} has jax installed: it cannot stand for a Python without it")
  return SYSTEM_PYTHON


def _plain_env() -> dict:
  """The environment of a shell where the venv was never activated."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
  env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                if ".venv" not in p)
  return env


@pytest.mark.parametrize("driver", ["experiments.ablation", "experiments.train"])
def test_a_driver_without_the_venv_says_in_one_line_to_activate_it(driver):
  python = _without_jax()
  out = subprocess.run([python, "-m", driver, "--preset=smoke"], cwd=ROOT,
                       capture_output=True, text=True, env=_plain_env(), timeout=60,
                       check=False)
  assert out.returncode == 1, out.stderr
  assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stderr, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  assert "'jax'" in lines[0] and python in lines[0]  # the module, and which Python lacks it
  assert "source .venv/bin/activate" in lines[0] and "`make`" in lines[0]
  assert out.stdout == ""
