"""The package's layers, checked from the source: imports only go downward.

The order, lowest first (docs/design.md says what lives in each):

  functions    the top-level modules (scores, masks, registry, attention, layers, ...)
  measure      attention_jax/measure/   (clocks, counters, compilation, provenance)
  models       attention_jax/models/
  decoding     attention_jax/decoding.py
  data         attention_jax/data/
  training     attention_jax/training/  (one run)
  sweep        attention_jax/sweep/     (many runs: the flat config, the plan, the workdir)
  analysis     attention_jax/analysis/  (reading any sweep's results, never training)
  experiments  experiments/             (the generic drivers, and a folder per study)

Beside the order: no study imports another study, and no generic driver
imports a study; `analysis` imports neither `measure` nor the trainer; every
study `experiments/<study>/` has its `results/<study>/` and `tests/<study>/`.

Every import is read, wherever it stands: inside functions, and under `if
TYPE_CHECKING:` too, since a cycle held apart only by that guard is still
two modules that each need the other. Fast: parses files, imports nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "attention_jax"
LAYERS = ("functions", "measure", "models", "decoding", "data", "training", "sweep",
          "analysis", "experiments")
# The subpackages of attention_jax and their layer (pallas_additive: a kernel,
# split by concern, on the floor of the functions it computes).
SUBPACKAGE_LAYERS = {"measure": "measure", "models": "models", "data": "data",
                     "training": "training", "sweep": "sweep", "analysis": "analysis",
                     "pallas_additive": "functions"}
# A run's modules: 16, so that a reader meets one concern there (provenance.py
# went to measure/ and files.py to the bottom floor, since every floor uses them).
MAX_TRAINING_MODULES = 16
# The analyses every sweep shares (reports, one table writer, plots,
# significance, scaling, ...): a study's own analysis lives in its folder.
MAX_ANALYSIS_MODULES = 8
# What `analysis` must not import: the measuring tools (a separate concern, the
# other way too) and the trainer (it reads results; it never builds a run).
ANALYSIS_MUST_NOT_IMPORT = (f"{PACKAGE}.measure", f"{PACKAGE}.training.train_lib")


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


def studies(root: Path = ROOT) -> list[str]:
  """The study folders: every package directly under experiments/."""
  return sorted(p.name for p in (root / "experiments").iterdir()
                if (p / "__init__.py").is_file())


def study_of(module: str, names: Sequence[str]) -> str | None:
  """The study a module of experiments/ belongs to (None: a generic driver,
  or not under experiments/)."""
  parts = module.split(".")
  if parts[0] == "experiments" and len(parts) > 1 and parts[1] in names:
    return parts[1]
  return None


def study_imports(graph: dict[str, set[str]], names: Sequence[str]) -> list[str]:
  """'a imports b' wherever a module imports a study's module from outside that
  study: another study, a generic driver or the library."""
  return sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                if study_of(b, names) is not None and study_of(a, names) != study_of(b, names))


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
            "from attention_jax import files\n"
            "if TYPE_CHECKING:\n  from attention_jax.training.train_lib import Trainer\n"
            "def f():\n  import attention_jax.sweep.config as c\n"
            "from . import steps\n")
  names = imported_names(source, "attention_jax.training.actions", is_package=False)
  assert {"attention_jax.files", "attention_jax.training.train_lib.Trainer",
          "attention_jax.sweep.config", "attention_jax.training.steps"} <= names
  modules = {m: Path() for m in ("attention_jax.training", "attention_jax.files",
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
    ("attention_jax.analysis.reports", "analysis"), ("attention_jax.measure.hlo", "measure"),
    ("attention_jax.files", "functions"), ("experiments.ablation", "experiments"),
    ("experiments.lr_threshold.threshold", "experiments")])
def test_each_module_has_its_layer(module, layer):
  assert layer_of(module) == layer


def test_an_import_across_studies_is_found():
  graph = {"experiments.a.run": {"experiments.a.tables", "experiments.b.tables"},
           "experiments.ablation": {"experiments.b.presets.x", "experiments.common"},
           "attention_jax.sweep.config": {"experiments.a.run"},
           "experiments.a.tables": set(), "experiments.b.tables": set()}
  assert study_imports(graph, ["a", "b"]) == [
      "attention_jax.sweep.config imports experiments.a.run",
      "experiments.a.run imports experiments.b.tables",
      "experiments.ablation imports experiments.b.presets.x"]


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


def test_no_study_imports_another_and_only_a_study_imports_its_own():
  names = studies()
  assert {"lr_threshold", "init_logits", "compile_check", "cpu_efficiency", "kernels"} <= set(names)
  assert study_imports(import_graph(source_modules()), names) == []


def test_every_study_has_its_results_and_tests_folder():
  missing = [f"{kind}/{name}" for name in studies() for kind in ("results", "tests")
             if not (ROOT / kind / name).is_dir()]
  assert missing == []


def test_analysis_is_a_few_general_modules_that_neither_measure_nor_train():
  modules = source_modules()
  analysis = sorted(m for m in modules if m.startswith(f"{PACKAGE}.analysis."))
  assert len(analysis) <= MAX_ANALYSIS_MODULES, analysis
  graph = import_graph(modules)
  found = sorted(f"{a} imports {b}" for a in analysis for b in graph[a]
                 if b.startswith(ANALYSIS_MUST_NOT_IMPORT))
  assert found == []
  measure = [m for m in modules if m.startswith(f"{PACKAGE}.measure")]
  assert measure and not any(b.startswith(f"{PACKAGE}.analysis")
                             for a in measure for b in graph[a])
