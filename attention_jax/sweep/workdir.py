"""Where a sweep keeps its runs, and when a run folder may be resumed or extended.

Workdir layout (every file written atomically; a re-run resumes). Each name
is spelled once: `Workdir` here, and the files of one run by
`training.run_folder.RunDir`.

  runs/<arm>_d<dim>/                one run's folder (`RunDir`): config.json records
                                    the settings its numbers depend on (`fingerprint`)
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

With `--members=learning_rate=a,b` the workdir has the first layout, each
run folder holding every member (seeds x values) of its arm and dim, and the
grid's reports (those of `--sweep=learning_rate=a,b`) beside its attention
heat maps; its config.json records the member list, which cannot change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir_lock
from attention_jax.sweep.config import ExperimentConfig
from attention_jax.sweep.config import GridPoint
from attention_jax import files
from attention_jax.training import multihost
from attention_jax.training.metrics_log import MetricsLog
from attention_jax.training.run_config import Arm
from attention_jax.training.run_folder import FileName
from attention_jax.training.run_folder import json_kind
from attention_jax.training.run_folder import RunDir

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


def wrong_value(old: dict, fp: dict) -> str | None:
  """What is wrong in `old` (a run folder's config.json), where one of its
  settings holds a value of another JSON kind than `fp`'s (`"steps": "20"`,
  `null`); None if each is of the kind `fp` gives (an integer passes for a
  number). Compared as they are, such a value is a TypeError deep in the
  resume rules (`why_not_extended`) rather than a line naming the file."""
  for key, now in fp.items():
    if key not in old:
      continue  # a setting added later ran at its default (`check_run`)
    there, want = json_kind(old[key]), json_kind(now)
    if there != want and not (want == "a number" and there == "an integer"):
      return f"`{key}` is {old[key]!r}, not {want}"
  return None


# What a refused run folder tells the person training: train elsewhere, or
# again from scratch. A reader of results passes its own (`check_run`).
TRAINING_ADVICE = "use another --workdir or delete that folder"


def _recorded(run: RunDir, fp: dict) -> dict:
  """The settings `run`'s config.json records (which must exist); a
  ValueError of one line naming the file where it is damaged or holds a
  setting of another kind than `fp`'s (`wrong_value`)."""
  remedy = f"restore it, or delete the folder {run.path} to train that run again"
  old = files.read_json(run.config, dict, remedy)
  wrong = wrong_value(old, fp)
  if wrong is not None:
    raise ValueError(f"{run.config} is damaged ({wrong}); {remedy}.")
  return old


def settings_diff(old: dict, fp: dict) -> dict[str, tuple]:
  """`{setting: (recorded, now)}` of every setting of `fp` (a `fingerprint`)
  that `old` (a run folder's config.json) records with another value. A
  setting added to the config after the folder was made ran at its default;
  one `old` holds that `fp` lacks (a field since dropped from a run's
  identity, such as `data_dir`) is no difference."""
  defaults = {**_settings(ExperimentConfig()), "arm": fp.get("arm"), "dim": fp.get("dim")}
  return {k: (old.get(k, defaults.get(k)), v) for k, v in fp.items()
          if old.get(k, defaults.get(k)) != v}


def _shown(diff: dict[str, tuple]) -> str:
  return ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())


def check_run(run: RunDir, fp: dict, write: bool = True,
              advice: str = TRAINING_ADVICE) -> int | None:
  """Refuses the run folder `run` if it was made with other settings than
  `fp` (a `fingerprint`), in one line ending with `advice`; records them in
  a new one (unless `write` is False). Returns the folder's step count where
  `fp` only asks for more steps and the run can be extended
  (`why_not_extended`), else None; the caller then extends it
  (`extend_run`)."""
  if os.path.exists(run.config):
    old = _recorded(run, fp)
    diff = settings_diff(old, fp)
    if set(diff) == {"steps"}:
      why = why_not_extended(old, fp)
      if why is None:
        return int(old["steps"])
      raise ValueError(f"{run.path} holds a run of {old['steps']} steps, not "
                       f"{fp['steps']}, and {why}; {advice}.")
    if "members" in diff:  # E is the checkpoint's shape: its members cannot change
      there, now = diff["members"]
      raise ValueError(f"{run.path} holds a run of --members={there!r}, not {now!r}: a "
                       f"run's members cannot change; {advice}.")
    if diff:
      raise ValueError(f"{run.path} holds a run with other settings ({_shown(diff)}); "
                       f"{advice}.")
  elif write and multihost.is_primary():
    run.record(fp)
  return None


def extend_run(run: RunDir, fp: dict, old_steps: int) -> None:
  """Turns the finished (or unfinished) run of `old_steps` in `run` into an
  unfinished one of `fp["steps"]`: its result moves aside to
  `run.result_of(old_steps)` (kept), then the new settings are recorded;
  training resumes from the last checkpoint. A kill between the two leaves
  an unfinished run of `old_steps` whose extension is asked again by a re-run."""
  if run.finished:
    os.replace(run.result, run.result_of(old_steps))
  run.record(fp)


@dataclasses.dataclass(frozen=True)
class Workdir:
  """A sweep's folder (or one grid point's): its runs, reports and lock."""
  path: str
  results = FileName("results.jsonl")
  table = FileName("table.md")
  ablation_plot = FileName("ablation.png")
  validation_plot = FileName("validation.png")
  diagnostics_plot = FileName("diagnostics.png")
  max_logit_plot = FileName("max_logit.png")
  kinds_plot = FileName("kinds.png")  # the Transformer's, per attention kind

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


# --- one configuration per workdir -------------------------------------------

def _holds_runs(path: str) -> bool:
  """Whether the workdir `path` holds a run folder that recorded its settings
  (an empty `runs/` folder is no layout)."""
  runs = os.path.join(path, "runs")
  return os.path.isdir(runs) and any(
      os.path.isfile(os.path.join(runs, name, "config.json")) for name in os.listdir(runs))


def _point_folders(path: str) -> dict[str, dict]:
  """The `--sweep` grid points found in the folder `path`: `{folder name:
  {field: value}}` of every sub-folder named as a grid point names its
  folder (`config.GridPoint.name`, each field=value a valid axis) that holds
  a run folder (`_holds_runs`)."""
  out = {}
  for name in sorted(os.listdir(path)) if os.path.isdir(path) else ():
    if "=" not in name or not _holds_runs(os.path.join(path, name)):
      continue
    try:
      values = dict(config_lib.parse_axis(item) for item in name.split(","))
    except ValueError:
      continue  # a folder of the user's, not a grid point
    out[name] = {field: value[0] for field, value in values.items()}
  return out


def _layout_problem(workdir: Workdir, grid: tuple[GridPoint, ...] | None,
                    points: dict[str, dict]) -> str | None:
  """What in the layout of `workdir` does not match a sweep of `grid` (None:
  no `--sweep`) given its grid point folders `points`; None if nothing."""
  flat = _holds_runs(workdir.path)
  if grid is None:
    if points:
      axes = list(next(iter(points.values())))
      return (f"holds a --sweep grid over {','.join(axes)} ({len(points)} grid point "
              f"folder(s) such as {next(iter(points))}), not the runs of one sweep: give "
              + " ".join(f"--sweep={axis}=..." for axis in axes) + " as the grid was made")
    return None
  axes = list(grid[0].values)
  if flat:
    return (f"holds the runs of one sweep ({os.path.join(workdir.path, 'runs')}), not a "
            f"--sweep grid: drop --sweep")
  for name, values in points.items():
    if list(values) != axes:
      return (f"holds a --sweep grid over {','.join(values)} (such as {name}), not over "
              f"{','.join(axes)}: give " + " ".join(f"--sweep={axis}=..." for axis in values)
              + " as the grid was made")
  return None


_FIRST = ("model", "dataset", "members")


def _other_settings(workdir: Workdir, cfg: ExperimentConfig,
                    ignore: tuple[str, ...] = ()) -> str | None:
  """The first run folder of `workdir` whose settings differ from `cfg`'s in
  more than its arm and dimension, `ignore` and its steps (a larger
  `--steps` extends a run; `check_run` judges each run the command trains),
  as `'<folder> (<settings>)'`; None if none does. Its config.json damaged:
  a ValueError naming it (`_recorded`)."""
  runs = os.path.join(workdir.path, "runs")
  settings = _settings(cfg)
  for name in sorted(os.listdir(runs)) if os.path.isdir(runs) else ():
    run = RunDir(os.path.join(runs, name))
    if not os.path.isfile(run.config):
      continue  # made by a start killed before it recorded anything
    old = _recorded(run, settings)
    fp = {**settings, "arm": old.get("arm"), "dim": old.get("dim")}
    diff = {k: d for k, d in settings_diff(old, fp).items()
            if k not in ("arm", "dim") + tuple(ignore)}
    # What tells another preset first: the family and the data, then the rest in order.
    diff = dict(sorted(diff.items(), key=lambda item: item[0] not in _FIRST))
    if set(diff) - {"steps"}:
      return f"{run.path} ({_shown(diff)})"
  return None


def check_configuration(workdir: Workdir, cfg: ExperimentConfig,
                        grid: tuple[GridPoint, ...] | None = None) -> None:
  """Refuses, in one line naming the folder and the settings that differ, a
  sweep of `cfg` (with `grid`, a `--sweep` grid) in a `workdir` that holds
  runs of another configuration: another layout (a grid given no `--sweep`
  or other axes, the runs of one sweep given `--sweep`), or a run folder made
  with other settings than `cfg` gives it (another preset, model family,
  dataset, `--members`, seeds ...). Reads only: called before any work.

  What may differ is what the documented extensions change: the arms and
  dims (`RESUMABLE_FIELDS`: more arms or dims add run folders), the fields
  that change no number (`config.NO_NUMBERS`), the steps (a larger `--steps`
  extends the runs, `check_run` judges each) and the values of the grid's
  axes (more values add points). Refusing only where two runs' folders
  collide (`check_run`) let another preset train beside finished runs, and
  the reports then mixed or replaced them without a word."""
  points = _point_folders(workdir.path)
  problem = _layout_problem(workdir, grid, points)
  if problem is not None:
    raise ValueError(f"`--workdir` {workdir.path} {problem}, or use another --workdir.")
  if grid is None:
    places = [(workdir, cfg, ())]
  else:
    axes = tuple(grid[0].values)
    given = {p.name: p for p in grid}
    places = [(workdir.point(p), p.config, ()) for p in grid]
    # A point on disk that this grid does not name: its own axis values differ.
    places += [(Workdir(os.path.join(workdir.path, name)), cfg, axes)
               for name in points if name not in given]
  for folder, point_cfg, ignore in places:
    other = _other_settings(folder, point_cfg, ignore)
    if other is not None:
      raise ValueError(
          f"`--workdir` {workdir.path} holds runs made with other settings: {other}; a "
          "workdir holds one configuration of a sweep (more arms, dims, steps or grid values "
          "extend it, and a setting that changes no number may differ): give the settings "
          "of the runs there, or use another --workdir.")


# --- committed runs: files to restore, runs not to train again ------------------

def has_checkpoint(run: RunDir) -> bool:
  """Whether `run` holds a checkpoint step to resume from (an Orbax step
  folder: its name is the step); the runs committed under results/ keep none."""
  try:
    return any(name.isdigit() for name in os.listdir(run.checkpoints))
  except (FileNotFoundError, NotADirectoryError):
    return False


def tracked_by_git(path: str) -> bool:
  """Whether git tracks the file `path` (False where it is not in a git
  checkout, or git is missing)."""
  folder = os.path.dirname(os.path.abspath(path))
  try:
    return subprocess.run(
        ["git", "-C", folder, "ls-files", "--error-unmatch", "--", os.path.basename(path)],
        capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def restore_advice(run: RunDir, path: str) -> str | None:
  """What to do about the damaged file `path` of `run` where the usual
  remedy (delete it and re-run, which evaluates the run again from its last
  checkpoint) would cost the run: a file git tracks, or any file of a run
  that keeps no checkpoints, which a re-run would train again from step 1,
  cutting its metrics log. None for a run that can be evaluated again."""
  if tracked_by_git(path):
    return f"restore it with `git checkout -- {path}` (it is committed)"
  if not has_checkpoint(run):
    return (f"restore it from where the run was copied (`git checkout -- {path}` where it "
            "is committed): the run keeps no checkpoints, so deleting it and re-running "
            "would train the run again from step 1")
  return None


def restated(message: str, run: RunDir) -> str:
  """`message`, one line naming a file of `run` and, after its last '; ',
  what to do, with a remedy that has the run evaluated again by a re-run
  (the remedies of `run_folder` and the reports, written for a run with
  checkpoints) replaced by `restore_advice` where that would cost the run."""
  head, _, remedy = message.rpartition("; ")
  if not head or "re-run" not in remedy:
    return message
  names = (run.translations_gz, run.translations, run.result, run.attention, run.config)
  path = next((p for p in names if p in head), None)
  advice = None if path is None else restore_advice(run, path)
  return message if advice is None else f"{head}; {advice}."


def check_retraining(run: RunDir, fp: dict) -> int:
  """Refuses, in one line, to train `run` again from step 1 (it has no
  checkpoint) where it was finished: a finished run asked for more steps,
  or an unfinished one whose metrics log holds steps and git tracks it or
  whose folder holds the test translations of a finished evaluation (its
  result.json deleted). The runs committed under results/ keep no
  checkpoints, and deleting a damaged file and its result.json, as a remedy
  once said, made the next re-run train such a run from scratch and cut its
  log without a word. Otherwise returns the last step the log of a run
  about to start over holds (0 if none), for the caller to say so: a run
  killed before its first checkpoint, or whose checkpoints a copy left
  behind (`scripts/gpu_run.sh` over `SWEEP_STATE_MIB`), starts again as it
  always did. `fp` is its `fingerprint`."""
  if has_checkpoint(run):
    return 0
  if run.finished:
    if not os.path.isfile(run.config):
      return 0  # recorded as it is by `check_run`: skipped, nothing trains
    old = _recorded(run, fp)
    if int(old["steps"]) >= fp["steps"]:
      return 0  # finished: skipped, nothing trains
    raise ValueError(f"{run.path} is finished at {old['steps']} steps but has no checkpoint "
                     f"to extend it from: --steps={fp['steps']} would train it again from "
                     f"step 1 and cut its metrics log; keep --steps={old['steps']} for it "
                     f"(restore its checkpoints where they were kept), or delete the folder "
                     f"{run.path} to train the run of {fp['steps']} steps from scratch.")
  logged = [row["step"] for row in MetricsLog(run.metrics, write=False).read()
            if isinstance(row.get("step"), int)] if os.path.isfile(run.metrics) else []
  if not logged:
    return 0
  if run.stored_translations is None and not tracked_by_git(run.metrics):
    return max(logged)
  what = ("is committed" if run.stored_translations is None else
          f"was finished ({os.path.basename(run.stored_translations)} is there)")
  raise ValueError(f"{run.path} {what} but has no result.json and no checkpoint: training it "
                   "would start again from step 1 and cut its metrics log, which holds steps "
                   f"up to {max(logged)}; restore the run's files (`git checkout -- "
                   f"{run.path}` where it is committed), or delete {run.metrics} to train the "
                   "run again from scratch.")


class UnreadableRuns(ValueError):
  """Raised by a sweep's report (`runner.Report`) after it wrote every report
  it could: `problems` maps the folder of each run whose files could not be
  read, left out, to one line naming the file and what to do; `table` is
  the table written without them."""

  def __init__(self, table: str, problems: dict[str, str]):
    self.table, self.problems = table, dict(problems)
    runs = "run is" if len(problems) == 1 else "runs are"
    super().__init__(f"{len(problems)} {runs} left out of the reports: "
                     + " ".join(self.problems.values()))
