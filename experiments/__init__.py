"""The drivers (`python -m experiments.X`).

`python -m experiments.X` imports this package first: a Python without the
project's dependencies (a forgotten `source .venv/bin/activate`, the
system's `python3`) is told so here in one line, where it met a
`ModuleNotFoundError` traceback from deep in the first import before.
`find_spec` only looks the modules up: nothing is imported.
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
