"""Shared by the drivers' tests (every study's and the generic ones'): many refused command lines checked in one process.

A driver refusing a bad flag or path is checked end to end (a real subprocess,
its exit status and stderr) by at least one test per driver. The other bad
inputs of the same driver go through `refusals`: one Python process imports
the driver once, then, for each command line in turn, parses it into the
driver's flags afresh (`FLAGS.unparse_flags`, as a new process starts with
none given) and calls the driver's `main` as `app.run` does, from the case's
own working folder, recording what a process would show: the exit status
(`sys.exit("error: ...")` is status 1 and that text on stderr, as Python
prints it), stdout and stderr. Each case keeps its own result and its own
assertions; only the interpreter's and JAX's start-up (most of a refused
command's 2 s) is paid once instead of once per case.

A command line absl cannot parse (an enum or integer flag given a bad value)
never reaches `main`: `refusals` returns it as status "flags" with absl's
message, and a test of that path runs the real process instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r"""
import contextlib, importlib, io, json, os, sys, traceback
from absl import flags
module, define, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
driver = importlib.import_module(module)
if define:
  getattr(driver, define)()
FLAGS = flags.FLAGS
results = []
for case in cases:
  os.chdir(case["cwd"])
  out, err = io.StringIO(), io.StringIO()
  status = 0
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      FLAGS.unparse_flags()
      argv = FLAGS([module] + case["argv"])
    except flags.Error as e:
      status, argv = "flags", None
      print(e, file=sys.stderr)
    if argv is not None:
      sys.argv = [module] + case["argv"]
      try:
        driver.main(argv)
      except SystemExit as e:  # what the interpreter makes of it at the top
        if e.code is None or isinstance(e.code, int):
          status = e.code or 0
        else:
          status = 1
          print(e.code, file=sys.stderr)
      except Exception:  # pylint: disable=broad-except
        status = 1
        traceback.print_exc()
  results.append({"returncode": status, "stdout": out.getvalue(), "stderr": err.getvalue()})
sys.stdout.write("\nRESULTS " + json.dumps(results))
"""


class Result:
  """What one refused command line showed, as `subprocess.run` returns it."""

  def __init__(self, returncode, stdout, stderr):
    self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def refusals(module: str, cases: list[tuple[list[str], str]], define: str = "",
             timeout: int = 300) -> list[Result]:
  """Runs `module`'s `main` on each (argv, cwd) of `cases` in one process
  (module docstring); `define`: the driver's function that defines its flags
  where its `__main__` block calls one. Returns a `Result` per case, in order."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, module, define,
                         json.dumps([{"argv": list(a), "cwd": str(c)} for a, c in cases])],
                        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
  assert proc.returncode == 0 and "\nRESULTS " in proc.stdout, proc.stderr[-3000:]
  results = json.loads(proc.stdout.rsplit("\nRESULTS ", 1)[1])
  assert len(results) == len(cases)
  return [Result(**r) for r in results]


@pytest.fixture(scope="session")
def run_refusals():
  return refusals
