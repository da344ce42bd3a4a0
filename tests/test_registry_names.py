"""No library or driver code branches on a score's name: what differs between
scores is a field of its registry entry (`registry.Score`), so that a newly
registered score is treated by what it is, not skipped because a hand list
lacks it.

The check reads the source with `ast` and looks for comparisons (`==`, `!=`,
`in`, `not in`, and `match` cases) one of whose operands is a registered
score's name: a string constant, a tuple / list / set / dict literal holding
one, or a module-level name bound to such a literal (a hand list such as
`SCORES_WITH_X = ("dot", ...)`). Literals outside comparisons (a preset's
arms, a flag's default, a docstring) are configuration and text, not
branches, and are not looked at; nor are the presets' files, nor the
registry's own modules, which define the entries.
"""

import ast
import pathlib

from attention_jax import registry

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("attention_jax", "experiments", "scripts")
# The modules that define the entries.
REGISTRY_MODULES = {"attention_jax/registry.py", "attention_jax/scores.py",
                    "attention_jax/score_kinds.py"}

# Comparisons with a score's name that branch on nothing a score is, by
# (file, the comparison as `ast.unparse` writes it): a name of another kind
# that happens to be a score's too, or a documented default that picks one
# arm. Why each is allowed.
ALLOWED = {
    ("attention_jax/training/run_config.py", "self.schedule == 'cosine'"):
        "a learning-rate schedule named cosine, not the score",
    ("experiments/kernels/report.py", "r['suite'] == 'additive'"):
        "the kernel benchmark's `additive` suite, not the score",
    ("experiments/compile_check/tables.py", "r['program'] == 'additive'"):
        "the compile check's `additive` program, not the score",
    ("experiments/kernels/report.py", "'scaled_dot' not in times"):
        "the kernel tables' baseline implementation, which the ratios divide by",
    ("attention_jax/analysis/reports.py", "'additive' in cfg.arms"):
        "the documented default of `--baseline` (additive when swept, as Britz et al.)",
}


def _is_preset(path: str) -> bool:
  """A preset file: configuration listing arms, not code."""
  return "/presets/" in path


def scanned_files() -> list[str]:
  """The library and driver modules the check reads, relative to the root."""
  paths = []
  for top in SCANNED:
    for path in sorted((ROOT / top).rglob("*.py")):
      rel = path.relative_to(ROOT).as_posix()
      if rel not in REGISTRY_MODULES and not _is_preset(rel):
        paths.append(rel)
  return paths


def _strings(node: ast.AST) -> set[str]:
  """The string constants `node` is or, as a literal container, holds (a
  dict's keys)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return {node.value}
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
  if isinstance(node, ast.Dict):
    return set().union(*(_strings(k) for k in node.keys if k is not None)) if node.keys else set()
  return set()


def _module_literals(tree: ast.Module) -> dict[str, set[str]]:
  """`{name: strings}` of the module-level names bound to a string literal
  or a literal container of strings."""
  bound = {}
  for stmt in tree.body:
    targets, value = [], None
    if isinstance(stmt, ast.Assign):
      targets, value = stmt.targets, stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
      targets, value = [stmt.target], stmt.value
    for target in targets:
      if isinstance(target, ast.Name) and _strings(value):
        bound[target.id] = _strings(value)
  return bound


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
  """`(line, comparison)` of every comparison in `source` with an operand
  that is, holds or names a literal holding one of `names`."""
  tree = ast.parse(source)
  bound = _module_literals(tree)

  def named(node: ast.AST) -> bool:
    held = _strings(node)
    if isinstance(node, ast.Name):
      held = bound.get(node.id, set())
    return bool(held & names)

  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare) and any(named(n) for n in [node.left, *node.comparators]):
      found.append((node.lineno, ast.unparse(node)))
    elif isinstance(node, ast.MatchValue) and named(node.value):
      found.append((node.lineno, f"case {ast.unparse(node.value)}"))
  return found


def test_the_check_finds_each_form_of_comparison():
  names = {"additive", "dot"}
  source = "\n".join([
      "HAND = ('dot', 'general')",
      "def f(score, other):",
      "  a = score == 'additive'",
      "  b = score in ('dot', 'scaled_dot')",
      "  c = score not in {'dot': 1}",
      "  d = score in HAND",
      "  e = other == 'constant'",  # no score name
      "  g = ('dot', 'additive')",  # a literal, compared with nothing
      "  match score:",
      "    case 'additive':",
      "      pass",
  ])
  found = [line for line, _ in name_comparisons(source, names)]
  assert found == [3, 4, 5, 6, 10]


def test_no_code_compares_a_score_name():
  names = set(registry.SCORES)
  found = {}
  for path in scanned_files():
    for line, text in name_comparisons((ROOT / path).read_text(), names):
      found[(path, text)] = line
  branches = [f"{path}:{line}: {text}" for (path, text), line in sorted(found.items())
              if (path, text) not in ALLOWED]
  assert not branches, (
      "code compares registered score names; read the difference from a field of "
      "the entry (registry.Score) instead:\n" + "\n".join(branches))
  stale = sorted(set(ALLOWED) - set(found))
  assert not stale, f"allowed comparisons no longer in the code: {stale}"
