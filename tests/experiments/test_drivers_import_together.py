"""The driver modules that tests import can be imported together in one process.

pytest-xdist puts test files of different drivers into one worker process; a
command-line flag that two drivers define at import time then fails the whole
file at collection (DuplicateFlagError), depending on how files were dealt.
"""

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _driver_modules_tests_import() -> list[str]:
  """The modules of experiments/ that some test file imports into its own process
  (import statements of the code, not scripts in strings run as subprocesses)."""
  names = set()
  for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
    for f in files:
      if f.endswith(".py"):
        with open(os.path.join(folder, f), encoding="utf-8") as fh:
          tree = ast.parse(fh.read())
        for node in ast.walk(tree):
          if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
          elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{a.name}" for a in node.names)
            names.add(node.module)
  return sorted(n for n in names if n.startswith("experiments.")
                and os.path.exists(os.path.join(ROOT, *n.split(".")) + ".py"))


def test_the_drivers_tests_import_load_in_one_process_in_both_orders():
  modules = _driver_modules_tests_import()
  assert {"experiments.init_logits.run", "experiments.calibration",
          "experiments.kernels.run"} <= set(modules), modules
  for order in (modules, modules[::-1]):
    code = "import importlib\nfor m in %r:\n  importlib.import_module(m)\n" % (order,)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
