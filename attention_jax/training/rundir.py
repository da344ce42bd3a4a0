"""Where a sweep keeps its files, and when a run folder may be resumed or extended.

Workdir layout (every file written atomically; a re-run resumes). Each name
is spelled once, here: `Workdir` and `RunDir` hand out the paths.

  runs/<arm>_d<dim>/config.json     settings the run was made with (`fingerprint`)
  runs/<arm>_d<dim>/checkpoints/    Orbax checkpoints (latest two)
  runs/<arm>_d<dim>/metrics.jsonl   loss, softmax diagnostics, validation BLEU
  runs/<arm>_d<dim>/attention.json  alignment of test sentence 0 (seed 0)
  runs/<arm>_d<dim>/test_translations.json  final test outputs per seed (for significance)
  runs/<arm>_d<dim>/significance.json       cached paired test against the baseline arm
  runs/<arm>_d<dim>/result.json     one row per seed; its presence = finished
  runs/<arm>_d<dim>/result.steps<N>.json  the result of N steps, kept when a
                                    larger --steps extended the run (`RunDir.extend`)
  .lock                             PID, host and start of the driver using the workdir
  results.jsonl, table.md, ablation.png, validation.png, diagnostics.png,
  attention_<arm>_<dim>.png, kinds.png (the Transformer's)

With `axes` (e.g. `--sweep=learning_rate=3e-4,1e-3`) every grid point is a
workdir of the layout above in `<workdir>/<field>=<value>[,<field>=<value>]/`
(`config.GridPoint.name`, `Workdir.point`), resumed and skipped per point,
and the workdir itself holds the pivoted reports of the whole grid:

  .lock, results.jsonl (every row with its swept values), table.md (arms
  against the first axis, one table per dim and value of any further axis),
  sweep_<axis>.png, max_logit.png, kinds.png (the Transformer's)
"""

from __future__ import annotations

import dataclasses
import json
import os

from attention_jax.training import config as config_lib
from attention_jax.training import files
from attention_jax.training import multihost
from attention_jax.training import workdir_lock
from attention_jax.training.config import Arm
from attention_jax.training.config import ExperimentConfig
from attention_jax.training.config import GridPoint

# Fields that do not change a run's numbers: a run resumes under other values.
# `arms` and `dims` are recorded as the run's own `arm` and `dim`; the others
# are marked where they are defined (`config.NO_NUMBERS`), the one list that
# `--sweep` also refuses.
RESUMABLE_FIELDS = ("arms", "dims") + config_lib.NO_NUMBERS


def _settings(cfg: ExperimentConfig) -> dict:
  """The fields of `cfg` that determine a run's numbers, as JSON gives them back."""
  d = {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_FIELDS}
  return json.loads(json.dumps(d))  # tuples -> lists, as they come back from JSON


def fingerprint(cfg: ExperimentConfig, arm: Arm) -> dict:
  """The settings that determine the numbers of `arm`'s run under `cfg`
  (what a run folder's config.json records)."""
  return {**_settings(cfg), "arm": arm.name, "dim": arm.attention_dim}


def why_not_extended(old: dict, fp: dict) -> str | None:
  """Why the run recorded as `old` cannot go on to `fp["steps"]` with the
  numbers a run of that length from scratch would give; None if it can.

  Under the constant schedule nothing in a step depends on the total: the
  batches, dropout keys and learning rate of step s are the same in a run of
  any length, so continuing the checkpoint of the last step gives the longer
  run's numbers, provided the shorter run evaluated (and logged diagnostics)
  only where the longer one does - its last step is an evaluation step of
  both (`test_extending_a_finished_run_gives_the_longer_runs_numbers`).
  """
  if fp["schedule"] != "constant":
    return f"the {fp['schedule']} schedule depends on the number of steps"
  if fp["steps"] < old["steps"]:
    return "a run cannot be shortened"
  for name in ("eval_every", "diag_every"):
    if old["steps"] % fp[name]:
      return (f"{old['steps']} is not a multiple of `{name}` = {fp[name]} (a longer run "
              "would not have evaluated at its last step)")
  return None


def _kind(value) -> str:
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


def wrong_value(old: dict, fp: dict) -> str | None:
  """What is wrong in `old` (a run folder's config.json), where one of its
  settings holds a value of another JSON kind than `fp`'s (`"steps": "20"`,
  `null`); None if each is of the kind `fp` gives (an integer passes for a
  number). Compared as they are, such a value is a TypeError deep in the
  resume rules (`why_not_extended`) rather than a line naming the file."""
  for key, now in fp.items():
    if key not in old:
      continue  # a setting added later ran at its default (`RunDir.check`)
    there, want = _kind(old[key]), _kind(now)
    if there != want and not (want == "a number" and there == "an integer"):
      return f"`{key}` is {old[key]!r}, not {want}"
  return None


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


def row_problem(index: int, row) -> str | None:
  """What makes `row` (the `index`-th of a result.json) unreadable to the
  reports, in a few words; None if nothing. A row of another shape failed
  tens of lines deep in the table code, naming no file."""
  if not isinstance(row, dict):
    return f"row {index} is {_kind(row)}, not an object"
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
  diagnostics = row.get("diagnostics", {})
  if not isinstance(diagnostics, dict):
    return f"row {index}: `diagnostics` is {_kind(diagnostics)}, not an object"
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


def translations_to_compare(base: RunDir, other: RunDir) -> tuple[dict, dict]:
  """The test translations of the runs `base` and `other` (`test_translations`),
  which must be of the same references: a ValueError of one line naming both
  files if not (one was cut or comes from another test set)."""
  first, second = base.test_translations(), other.test_translations()
  if first["references"] != second["references"]:
    differ = ("a different number of references "
              f"({len(first['references'])} and {len(second['references'])})"
              if len(first["references"]) != len(second["references"])
              else "different references")
    raise ValueError(f"{base.translations} and {other.translations} hold {differ}, so their "
                     "runs cannot be compared; delete the wrong one and its run's "
                     "result.json, and re-run the same command to evaluate that run again.")
  return first, second


class _Name:
  """A file of a folder type, by name: on an instance, its path there."""

  def __init__(self, name: str):
    self.name = name

  def __get__(self, folder, owner=None) -> str:
    return self.name if folder is None else os.path.join(folder.path, self.name)


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The folder of one run (one arm at one dimension, every seed): its files,
  and whether it may be resumed or extended under a fingerprint."""
  path: str
  config = _Name("config.json")
  checkpoints = _Name("checkpoints")
  metrics = _Name("metrics.jsonl")
  attention = _Name("attention.json")
  translations = _Name("test_translations.json")
  significance = _Name("significance.json")
  result = _Name("result.json")

  def result_of(self, steps: int) -> str:
    """Where the result of the run's first `steps` steps is kept after an extension."""
    return os.path.join(self.path, f"result.steps{steps}.json")

  @property
  def finished(self) -> bool:
    return os.path.exists(self.result)

  def rows(self) -> list[dict]:
    """The finished run's rows, one per seed; a ValueError of one line naming
    the file if it holds none, or a row the reports could not read
    (`row_problem`)."""
    remedy = ("delete it and re-run the same command to evaluate that run again from its "
              "last checkpoint")
    rows = files.read_json(self.result, list, remedy)
    problem = "it holds no rows" if not rows else next(
        filter(None, (row_problem(i, row) for i, row in enumerate(rows))), None)
    if problem is not None:
      raise ValueError(f"{self.result} is damaged ({problem}); {remedy}.")
    return rows

  def test_translations(self) -> dict:
    """The run's stored test outputs, `{"references": [N], "hypotheses":
    [seeds][N] (None for a diverged member)}`; a ValueError of one line
    naming the file if they are not of that shape (`translations_problem`)."""
    value = files.read_json(self.translations, dict, _TRANSLATIONS_REMEDY)
    problem = translations_problem(value)
    if problem is not None:
      raise ValueError(f"{self.translations} is damaged ({problem}); {_TRANSLATIONS_REMEDY}.")
    return value

  def check(self, fp: dict, write: bool = True) -> int | None:
    """Refuses a folder made with other settings than `fp`; records them in a
    new one (unless `write` is False). Returns the folder's step count where
    `fp` only asks for more steps and the run can be extended
    (`why_not_extended`), else None; the caller then extends it (`extend`)."""
    if os.path.exists(self.config):
      remedy = f"restore it, or delete the folder {self.path} to train that run again"
      old = files.read_json(self.config, dict, remedy)
      wrong = wrong_value(old, fp)
      if wrong is not None:
        raise ValueError(f"{self.config} is damaged ({wrong}); {remedy}.")
      # A setting added to the config after the folder was made ran at its default.
      defaults = {**_settings(ExperimentConfig()), "arm": fp["arm"], "dim": fp["dim"]}
      diff = {k: (old.get(k, defaults.get(k)), v) for k, v in fp.items()
              if old.get(k, defaults.get(k)) != v}
      if set(diff) == {"steps"}:
        why = why_not_extended(old, fp)
        if why is None:
          return int(old["steps"])
        raise ValueError(f"{self.path} holds a run of {old['steps']} steps, not "
                         f"{fp['steps']}, and {why}; use another --workdir or delete that "
                         "folder.")
      if diff:
        shown = ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())
        raise ValueError(f"{self.path} holds a run with other settings ({shown}); "
                         "use another --workdir or delete that folder.")
    elif write and multihost.is_primary():
      self._record(fp)
    return None

  def extend(self, fp: dict, old_steps: int) -> None:
    """Turns the finished (or unfinished) run of `old_steps` here into an
    unfinished one of `fp["steps"]`: its result moves aside to
    `result_of(old_steps)` (kept), then the new settings are recorded;
    training resumes from the last checkpoint. A kill between the two leaves
    an unfinished run of `old_steps` whose extension is asked again by a re-run."""
    if self.finished:
      os.replace(self.result, self.result_of(old_steps))
    self._record(fp)

  def _record(self, fp: dict) -> None:
    files.atomic_write(self.config, files.to_json(fp, indent=1, sort_keys=True))


@dataclasses.dataclass(frozen=True)
class Workdir:
  """A sweep's folder (or one grid point's): its runs, reports and lock."""
  path: str
  results = _Name("results.jsonl")
  table = _Name("table.md")
  ablation_plot = _Name("ablation.png")
  validation_plot = _Name("validation.png")
  diagnostics_plot = _Name("diagnostics.png")
  max_logit_plot = _Name("max_logit.png")
  kinds_plot = _Name("kinds.png")  # the Transformer's, per attention kind

  def run(self, arm: Arm) -> RunDir:
    return RunDir(os.path.join(self.path, "runs", f"{arm.name}_d{arm.attention_dim}"))

  def point(self, point: GridPoint) -> Workdir:
    """The workdir of one point of a `--sweep` grid inside this one."""
    return Workdir(os.path.join(self.path, point.name))

  @property
  def exists(self) -> bool:
    return os.path.isdir(self.path)

  def lock(self, log=print) -> workdir_lock.WorkdirLock:
    """One driver at a time (`workdir_lock`); a context manager."""
    return workdir_lock.WorkdirLock(self.path, log=log)

  def attention_plot(self, arm: Arm) -> str:
    return os.path.join(self.path, f"attention_{arm.name}_{arm.attention_dim}.png")

  def sweep_plot(self, axis: str) -> str:
    """A grid's test BLEU and perplexity against its `axis`."""
    return os.path.join(self.path, f"sweep_{axis}.png")
