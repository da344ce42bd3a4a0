"""The drivers (`python -m experiments.X`).

`python -m experiments.X` imports this package first: a Python without the
project's dependencies (a forgotten `source .venv/bin/activate`, the
system's `python3`) is told so here in one line, where it met a
`ModuleNotFoundError` traceback from deep in the first import before.
`find_spec` only looks the modules up: nothing is imported.

A study is a folder here (`experiments/<study>/`: its drivers, its rule, its
tables and plots, and in `presets/` its presets); this package adds every
study's presets to the library's (`add_study_presets`, which `common` calls:
not at this package's import, since a driver such as the compile check must
set its environment before anything imports jax), so that `--preset` of every
driver (the generic `ablation` above all) names them, and no driver imports a
study for it.
"""

import importlib.util
import sys

# What every driver imports (absl for its flags); the rest of the
# dependencies come with them from the same install.
_NEEDED = ("numpy", "jax", "flax", "absl")

_missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
if _missing:
  raise SystemExit(
      f"error: this Python ({sys.executable}) has no module named {_missing[0]!r}"
      + (f" (nor {', '.join(map(repr, _missing[1:]))})" if _missing[1:] else "")
      + ": activate the project's venv (`source .venv/bin/activate`) or run `make`, "
      "which builds it, then run the command again")


def add_study_presets() -> None:
  """Each `experiments/<study>/presets/<name>.py` becomes the preset `<name>`
  (again: no change)."""
  import importlib  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config  # pylint: disable=g-import-not-at-top
  here = os.path.dirname(os.path.abspath(__file__))
  for study in sorted(os.listdir(here)):
    folder = os.path.join(here, study, "presets")
    if os.path.isfile(os.path.join(folder, "__init__.py")):
      config.add_presets(importlib.import_module(f"{__name__}.{study}.presets.{m.name}")
                         for m in pkgutil.iter_modules([folder]))

