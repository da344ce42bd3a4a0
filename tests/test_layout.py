"""The package's layers, checked from the source: imports only go downward.

The order, lowest first (docs/design.md says what lives in each):

  functions    the top-level modules (scores, masks, registry, attention, layers, ...)
  models       attention_jax/models/
  decoding     attention_jax/decoding.py
  data         attention_jax/data/
  training     attention_jax/training/  (one run)
  sweep        attention_jax/sweep/     (many runs: the flat config, the plan, the workdir)
  analysis     attention_jax/analysis/  (reading results, never training)
  experiments  experiments/             (the command lines)

Every import is read, wherever it stands: inside functions, and under `if
TYPE_CHECKING:` too, since a cycle held apart only by that guard is still
two modules that each need the other. Fast: parses files, imports nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "attention_jax"
LAYERS = ("functions", "models", "decoding", "data", "training", "sweep", "analysis",
          "experiments")
# The subpackages of attention_jax that are a layer of their own.
SUBPACKAGE_LAYERS = {"models": "models", "data": "data", "training": "training",
                     "sweep": "sweep", "analysis": "analysis"}
# A run's modules: about 16, so that a reader meets one concern there. 18 since
# progress.py (a run's timing and ETA) joined; provenance.py and files.py, which
# serve every floor rather than a run, are the ones to move out next.
MAX_TRAINING_MODULES = 18


def module_name(path: Path, root: Path = ROOT) -> str:
  """'attention_jax/training/steps.py' -> 'attention_jax.training.steps'; a
  package's __init__.py is the package."""
  parts = list(path.relative_to(root).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def source_modules(root: Path = ROOT) -> dict[str, Path]:
  """Every module of the package and of experiments/, by name."""
  paths = [*(root / PACKAGE).rglob("*.py"), *(root / "experiments").rglob("*.py")]
  return {module_name(p, root): p for p in sorted(paths) if "__pycache__" not in p.parts}


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
  """The dotted names every import statement of `source` (the module
  `module`) names, relative imports resolved: `from a.b import c` gives
  'a.b.c' (c may be a module or a name in a.b; `resolve` decides)."""
  names = set()
  package = module if is_package else module.rpartition(".")[0]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      names.update(f"{base}.{alias.name}" if alias.name != "*" else base
                   for alias in node.names)
  return names


def resolve(name: str, modules: dict[str, Path]) -> str | None:
  """The module of ours that importing `name` loads: the longest prefix of
  `name` that is one of `modules`; None for another distribution's."""
  parts = name.split(".")
  for end in range(len(parts), 0, -1):
    candidate = ".".join(parts[:end])
    if candidate in modules:
      return candidate
  return None


def layer_of(module: str) -> str:
  """The layer of a module of ours; a KeyError names a subpackage that has none."""
  parts = module.split(".")
  if parts[0] == "experiments":
    return "experiments"
  if len(parts) == 1:
    return "functions"  # the package's __init__
  if module == f"{PACKAGE}.decoding":
    return "decoding"
  if len(parts) == 2 and not (ROOT / PACKAGE / parts[1]).is_dir():
    return "functions"
  if parts[1] not in SUBPACKAGE_LAYERS:
    raise KeyError(f"{module}: the subpackage {parts[1]!r} is in no layer; name its "
                   "layer in tests/test_layout.py and docs/design.md")
  return SUBPACKAGE_LAYERS[parts[1]]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
  """module -> the modules of ours it imports (itself left out)."""
  graph = {}
  for name, path in modules.items():
    targets = {resolve(n, modules) for n in imported_names(
        path.read_text(), name, path.name == "__init__.py")}
    graph[name] = {t for t in targets if t is not None and t != name}
  return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
  """'a (layer) imports b (higher layer)' for every import against the order."""
  rank = {layer: i for i, layer in enumerate(LAYERS)}
  return sorted(f"{a} ({layer_of(a)}) imports {b} ({layer_of(b)})"
                for a, targets in graph.items() for b in targets
                if rank[layer_of(b)] > rank[layer_of(a)])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (as a path that returns to its start) per strongly connected
  group of modules that import one another (Tarjan's algorithm)."""
  index, low, on_stack, stack, groups = {}, {}, set(), [], []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(graph.get(node, ())):
      if nxt not in index:
        visit(nxt)
        low[node] = min(low[node], low[nxt])
      elif nxt in on_stack:
        low[node] = min(low[node], index[nxt])
    if low[node] == index[node]:
      group = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        group.append(member)
        if member == node:
          break
      if len(group) > 1:
        groups.append(set(group))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return [_path_through(group, graph) for group in groups]


def _path_through(group: set[str], graph: dict[str, set[str]]) -> list[str]:
  """A shortest cycle inside `group` (strongly connected) from its first
  member back to it, found breadth first."""
  start = min(group)
  parent, frontier = {start: None}, [start]
  while frontier:
    node = frontier.pop(0)
    for nxt in sorted(graph[node] & group):
      if nxt == start:
        path = [node]
        while parent[path[-1]] is not None:
          path.append(parent[path[-1]])
        return path[::-1] + [start]
      if nxt not in parent:
        parent[nxt] = node
        frontier.append(nxt)
  raise AssertionError(f"no cycle through {sorted(group)}")


# --- the checker itself, on made-up sources -------------------------------------


def test_imports_inside_functions_and_under_type_checking_are_read():
  source = ("from typing import TYPE_CHECKING\n"
            "from attention_jax.training import files\n"
            "if TYPE_CHECKING:\n  from attention_jax.training.train_lib import Trainer\n"
            "def f():\n  import attention_jax.sweep.config as c\n"
            "from . import steps\n")
  names = imported_names(source, "attention_jax.training.actions", is_package=False)
  assert {"attention_jax.training.files", "attention_jax.training.train_lib.Trainer",
          "attention_jax.sweep.config", "attention_jax.training.steps"} <= names
  modules = {m: Path() for m in ("attention_jax.training", "attention_jax.training.files",
                                 "attention_jax.training.train_lib")}
  assert resolve("attention_jax.training.train_lib.Trainer", modules) == (
      "attention_jax.training.train_lib")
  assert resolve("attention_jax.training.Trainer", modules) == "attention_jax.training"
  assert resolve("numpy.linalg", modules) is None


def test_an_upward_import_and_a_cycle_are_found():
  graph = {"attention_jax.training.a": {"attention_jax.sweep.b"},
           "attention_jax.sweep.b": {"attention_jax.training.c"},
           "attention_jax.training.c": {"attention_jax.training.a"},
           "attention_jax.scores": set()}
  assert upward_imports(graph) == [
      "attention_jax.training.a (training) imports attention_jax.sweep.b (sweep)"]
  assert cycles(graph) == [["attention_jax.sweep.b", "attention_jax.training.c",
                            "attention_jax.training.a", "attention_jax.sweep.b"]]
  assert cycles({"x": {"y"}, "y": set()}) == []


@pytest.mark.parametrize("module, layer", [
    ("attention_jax", "functions"), ("attention_jax.scores", "functions"),
    ("attention_jax.layers", "functions"), ("attention_jax.models.transformer", "models"),
    ("attention_jax.decoding", "decoding"), ("attention_jax.data.batching", "data"),
    ("attention_jax.training.steps", "training"), ("attention_jax.sweep.config", "sweep"),
    ("attention_jax.analysis.reports", "analysis"), ("experiments.ablation", "experiments")])
def test_each_module_has_its_layer(module, layer):
  assert layer_of(module) == layer


# --- the repository ----------------------------------------------------------------


def test_no_module_imports_a_higher_layer():
  graph = import_graph(source_modules())
  assert upward_imports(graph) == []


def test_no_import_cycle_among_the_package_modules():
  graph = import_graph({name: path for name, path in source_modules().items()
                        if name.split(".")[0] == PACKAGE})
  assert [" -> ".join(cycle) for cycle in cycles(graph)] == []


def test_training_holds_one_runs_modules_only():
  training = sorted(p.relative_to(ROOT / PACKAGE / "training").as_posix()
                    for p in (ROOT / PACKAGE / "training").rglob("*.py")
                    if p.name != "__init__.py" and "__pycache__" not in p.parts)
  assert len(training) <= MAX_TRAINING_MODULES, training


@pytest.mark.parametrize("layer", ["sweep", "analysis"])
def test_the_sweep_and_analysis_layers_are_packages(layer):
  assert (ROOT / PACKAGE / layer / "__init__.py").is_file()
