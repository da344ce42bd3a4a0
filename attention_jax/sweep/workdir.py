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

from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir_lock
from attention_jax.sweep.config import ExperimentConfig
from attention_jax.sweep.config import GridPoint
from attention_jax.training import files
from attention_jax.training import multihost
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


def check_run(run: RunDir, fp: dict, write: bool = True,
              advice: str = TRAINING_ADVICE) -> int | None:
  """Refuses the run folder `run` if it was made with other settings than
  `fp` (a `fingerprint`), in one line ending with `advice`; records them in
  a new one (unless `write` is False). Returns the folder's step count where
  `fp` only asks for more steps and the run can be extended
  (`why_not_extended`), else None; the caller then extends it
  (`extend_run`)."""
  if os.path.exists(run.config):
    remedy = f"restore it, or delete the folder {run.path} to train that run again"
    old = files.read_json(run.config, dict, remedy)
    wrong = wrong_value(old, fp)
    if wrong is not None:
      raise ValueError(f"{run.config} is damaged ({wrong}); {remedy}.")
    # A setting added to the config after the folder was made ran at its default.
    defaults = {**_settings(ExperimentConfig()), "arm": fp["arm"], "dim": fp["dim"]}
    diff = {k: (old.get(k, defaults.get(k)), v) for k, v in fp.items()
            if old.get(k, defaults.get(k)) != v}
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
      shown = ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())
      raise ValueError(f"{run.path} holds a run with other settings ({shown}); {advice}.")
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
