"""The folder of one run, and the reading of what a run wrote there.

  config.json     the settings the run was made with (what determines its numbers)
  checkpoints/    Orbax checkpoints (latest two)
  metrics.jsonl   loss, softmax diagnostics, validation BLEU
  attention.json  alignment of test sentence 0 (seed 0)
  test_translations.json  final test outputs per seed (for significance);
                          kept gzip'd in results/ (`.json.gz`), see `stored_translations`
  significance.json       cached paired test against the baseline arm
  significance.<values>.json  the same, of the members of one combination of
                          member values (a run with member values, `--members`)
  result.json     one row per seed; its presence = finished
  result.steps<N>.json    the result of N steps, kept when a longer run extended it

Each name is spelled once, here (`RunDir`); where run folders sit in a sweep's
workdir, and when one may be resumed or extended, is the sweep's business
(`attention_jax.sweep.workdir`).
"""

from __future__ import annotations

import dataclasses
import math
import os

from attention_jax import files


def json_kind(value) -> str:
  """The JSON kind of `value`, as a message names it."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "a boolean"
  if isinstance(value, int):
    return "an integer"
  if isinstance(value, float):
    return "a number"
  if isinstance(value, str):
    return "a string"
  return "a list" if isinstance(value, list) else "an object"


# What a result row holds for the reports, by kind (`row_problem`); numbers
# may be null (a diverged member has no BLEU, an old row no time).
_ROW_TEXT = ("arm",)
_ROW_INTEGERS = ("dim", "seed", "params")
_ROW_NUMBERS = ("steps", "train_seconds", "val_bleu", "best_step", "test_bleu", "val_ppl",
                "diverged_at_step")

_TRANSLATIONS_REMEDY = ("delete it and that run's result.json, and re-run the same command to "
                        "evaluate the run again")


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _not_finite(value) -> bool:
  """A number that is NaN or infinite: what a writer before strict JSON
  left where the writer now puts null (`files.to_json`)."""
  return isinstance(value, float) and not math.isfinite(value)


def row_problem(index: int, row) -> str | None:
  """What makes `row` (the `index`-th of a result.json) unreadable to the
  reports, in a few words; None if nothing. A row of another shape failed
  tens of lines deep in the table code, naming no file."""
  if not isinstance(row, dict):
    return f"row {index} is {json_kind(row)}, not an object"
  for key in _ROW_TEXT + _ROW_INTEGERS:
    if key not in row:
      return f"row {index} has no `{key}`"
  for key in _ROW_TEXT:
    if not isinstance(row[key], str):
      return f"row {index}: `{key}` is {row[key]!r}, not a string"
  for key in _ROW_INTEGERS:
    if not isinstance(row[key], int) or isinstance(row[key], bool):
      return f"row {index}: `{key}` is {row[key]!r}, not an integer"
  for key in _ROW_NUMBERS:
    if row.get(key) is not None and not _is_number(row[key]):
      return f"row {index}: `{key}` is {row[key]!r}, not a number"
  if _not_finite(row.get("diverged_at_step")):  # NaN is true: it read as diverged
    return f"row {index}: `diverged_at_step` is {row['diverged_at_step']!r}, not a step"
  # A diverged member's numbers are no numbers (its BLEU, its perplexity):
  # null, or NaN from an older writer, reads as null (`RunDir.rows`). In a
  # row that records no divergence a NaN or infinite number says nothing we
  # could tell apart from a bug; counted, it was a `nan ± nan` cell.
  if not row.get("diverged_at_step"):
    for key, value in row.items():
      if _not_finite(value):
        return (f"row {index}: `{key}` is {value!r}, not a finite number, in a row that "
                "records no divergence (`diverged_at_step`)")
  diagnostics = row.get("diagnostics", {})
  if not isinstance(diagnostics, dict):
    return f"row {index}: `diagnostics` is {json_kind(diagnostics)}, not an object"
  for key, value in diagnostics.items():
    if value is not None and not _is_number(value):
      return f"row {index}: diagnostic `{key}` is {value!r}, not a number"
  return None


def _lines(value) -> bool:
  return isinstance(value, list) and all(isinstance(line, str) for line in value)


def translations_problem(value: dict) -> str | None:
  """What makes `value` (a test_translations.json) unusable for the paired
  test, in a few words; None if nothing: references a non-empty list of
  lines, and for each member its hypotheses, as many lines, or null."""
  references, hypotheses = value.get("references"), value.get("hypotheses")
  if not _lines(references) or not references:
    return "`references` is not a non-empty list of lines"
  if not isinstance(hypotheses, list) or not hypotheses:
    return "`hypotheses` is not a non-empty list (one per seed)"
  for member, lines in enumerate(hypotheses):
    if lines is None:
      continue  # a diverged member
    if not _lines(lines):
      return f"the hypotheses of member {member} are not a list of lines"
    if len(lines) != len(references):
      return (f"member {member} has {len(lines)} hypotheses for {len(references)} "
              "references")
  return None


class FileName:
  """A file of a folder type, by name: on an instance, its path there."""

  def __init__(self, name: str):
    self.name = name

  def __get__(self, folder, owner=None) -> str:
    return self.name if folder is None else os.path.join(folder.path, self.name)


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The folder of one run (one arm at one dimension, every seed): its files,
  and the reading of its results (`rows`, `test_translations`)."""
  path: str
  config = FileName("config.json")
  checkpoints = FileName("checkpoints")
  metrics = FileName("metrics.jsonl")
  attention = FileName("attention.json")
  translations = FileName("test_translations.json")
  translations_gz = FileName("test_translations.json.gz")
  significance = FileName("significance.json")
  result = FileName("result.json")

  def significance_of(self, values: str) -> str:
    """The cached paired test of the members at one combination of member
    values, `values` as a grid point names it ('learning_rate=0.001')."""
    return os.path.join(self.path, f"significance.{values}.json")

  def result_of(self, steps: int) -> str:
    """Where the result of the run's first `steps` steps is kept after an extension."""
    return os.path.join(self.path, f"result.steps{steps}.json")

  @property
  def finished(self) -> bool:
    return os.path.exists(self.result)

  def rows(self) -> list[dict]:
    """The finished run's rows, one per seed; a ValueError of one line naming
    the file if it holds none, or a row the reports could not read
    (`row_problem`). A NaN or infinite number that `row_problem` lets
    through (a diverged member's, a diagnostic) reads as null, what the
    writer puts there now: never a number to a report."""
    remedy = ("delete it and re-run the same command to evaluate that run again from its "
              "last checkpoint")
    rows = files.read_json(self.result, list, remedy)
    problem = "it holds no rows" if not rows else next(
        filter(None, (row_problem(i, row) for i, row in enumerate(rows))), None)
    if problem is not None:
      raise ValueError(f"{self.result} is damaged ({problem}); {remedy}.")
    return [files.finite(row) for row in rows]

  @property
  def stored_translations(self) -> str | None:
    """The file of the run's test outputs: test_translations.json, as a run
    writes it, else test_translations.json.gz, as the runs committed under
    results/ keep it (4x smaller: their plain text had grown the tree that
    a device call carries, at most 64 MiB with the GPU bundle, past room for
    the bundle); None if there is neither. Where both are there, the .json;
    reading it refuses them where they hold different outputs
    (`_check_one_output`)."""
    for path in (self.translations, self.translations_gz):
      if os.path.exists(path):
        return path
    return None

  def _check_one_output(self) -> None:
    """A ValueError of one line naming both files where the run keeps its
    test outputs in both and they differ: which one is the run's cannot be
    told (the .json won, silently). The same outputs twice are fine."""
    if not (os.path.exists(self.translations) and os.path.exists(self.translations_gz)):
      return
    if files.read_bytes(self.translations) != files.read_bytes(self.translations_gz,
                                                               _TRANSLATIONS_REMEDY):
      raise ValueError(f"{self.translations} and {self.translations_gz} both hold the run's "
                       "test outputs, and they differ; keep the one of the run's result.json "
                       "(a run writes the .json; the .gz is a copy kept under results/) and "
                       "delete the other.")

  def translations_bytes(self) -> bytes:
    """The JSON text of the run's test outputs (`stored_translations`, which
    must exist), uncompressed: the same bytes for either file, so that a
    digest of them (the significance cache's) does not depend on which."""
    self._check_one_output()
    return files.read_bytes(self.stored_translations, _TRANSLATIONS_REMEDY)

  def test_translations(self) -> dict:
    """The run's stored test outputs (`stored_translations`), `{"references":
    [N], "hypotheses": [seeds][N] (None for a diverged member)}`; a
    ValueError of one line naming the file if they are not of that shape
    (`translations_problem`)."""
    self._check_one_output()
    path = self.stored_translations
    value = files.read_json(path, dict, _TRANSLATIONS_REMEDY)
    problem = translations_problem(value)
    if problem is not None:
      raise ValueError(f"{path} is damaged ({problem}); {_TRANSLATIONS_REMEDY}.")
    return value

  def record(self, settings: dict) -> None:
    """Writes `settings` (what determines the run's numbers) as its config.json."""
    files.atomic_write(self.config, files.to_json(settings, indent=1, sort_keys=True))
