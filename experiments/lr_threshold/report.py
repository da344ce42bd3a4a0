r"""The learning-rate x d_k analysis of the `transformer_lr_cpu` grid, or of the
`transformer_lr` grid of one layer norm.

    python -m experiments.lr_threshold.report --main=W/main --controls=W/controls \
        --out=OUT
    python -m experiments.lr_threshold.report --preset=transformer_lr --layer_norm=pre \
        --main=runs/transformer_lr/pre --out=OUT
    python -m experiments.lr_threshold.report --preset=transformer_lr_premise \
        --main=runs/transformer_lr_premise --out=OUT

reads the two workdirs that results/lr_threshold/transformer_lr_cpu/commands.sh trains
(finished or still running; `--controls=` leaves the controls out), or the
workdir of one layer norm of `transformer_lr` (its every score, as a
`--sweep=learning_rate=...` grid or as `--members` runs; the preset's
docstring has both commands), and
writes into --out (created): lr_threshold.md (the tables), lr_threshold.json
(every number, and the provenance its result rows record) and the figures.
The rule is the preset's docstring, applied by `attention_jax.analysis.
threshold`; cells not yet known are listed and left out. The outputs name
no folder of this machine: the inputs are given relative to --out.

The report's files are written into a staging folder in --out and put in
place together (`files.Staging`): a full disk (one `error:` line, exit 1)
or a SIGTERM / Ctrl-C while they are written (one line, exit 143 / 130)
leaves the report --out held before, whole. A report that would differ from
the one --out holds only in when it was made (`analysed_at`) leaves that one
as it is, its commit included. A bad flag, workdir or logged
value is one `error:` line naming it, before anything is written.
"""

import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
MARKDOWN = "lr_threshold.md"
JSON = "lr_threshold.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_flags() -> None:
  """Defined only when this module is the program: drivers that tests import
  beside it define `--out` too."""
  flags.DEFINE_string("main", None, "Workdir of the main grid (dot, scaled_dot).")
  flags.DEFINE_string("controls", "", "Workdir of the controls grid (inverse_dim, qk_norm); "
                      "empty: left out.")
  flags.DEFINE_string("out", None, "Output folder (created).")
  flags.DEFINE_string("preset", "transformer_lr_cpu", "The preset whose grid --main holds: "
                      "transformer_lr_cpu (main and controls grids), transformer_lr (every "
                      "score in --main, one layer norm), transformer_lr_premise_cpu (its "
                      "adaptive grid) or transformer_lr_premise (its ladder as members, "
                      "judged with its bands).")
  flags.DEFINE_string("layer_norm", "", "post or pre: the layer norm the grid was trained "
                      "with (default the preset's).")
  flags.DEFINE_string("fine", "", "transformer_lr_cpu: the workdir of its refinement (dot "
                      "and scaled_dot at the premise preset's GLOROT_FINE_RATES), read with "
                      "--main as one grid and judged with the premise preset's bands.")
  flags.DEFINE_bool("plan", False, "transformer_lr_premise_cpu: print the runs to train "
                    "next (those its adaptive rule asks for, and extra ones planned but "
                    "not finished), a line per (score, d_k): 'SCORE DIM RATE,RATE,...' "
                    "(every extra rate of that pair, the new ones included), and write "
                    "nothing.")


def path_problem(main: str | None, controls: str, out: str | None) -> str | None:
  """The first bad path, as one line naming its flag; None if all are usable."""
  if not main:
    return "--main is required: the workdir of the main grid."
  if not out:
    return "--out is required: the folder the report is written to."
  for flag, path in (("--main", main), ("--controls", controls)):
    if path and not os.path.isdir(path):
      return f"{flag}: no folder {path!r}."
  if os.path.exists(out) and not os.path.isdir(out):
    return f"--out: {out!r} exists and is not a folder."
  parent = os.path.abspath(out)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
    return f"--out: cannot create or write {out!r} ({parent!r} is not a writable folder)."
  return None


def grid_problem(flag: str, path: str, cfg, learning_rates) -> str | None:
  """Why `path` is not a workdir of the grid: no run folder of its plan
  (as a `--sweep` grid or as `--members` runs), or run folders of both
  (`grids.layout`); None if it holds one. A swapped --main and
  --controls is caught here."""
  from experiments.lr_threshold import grids as grids_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  try:
    if grids_lib.layout(path, cfg, learning_rates) is not None:
      return None
  except ValueError as e:
    return f"{flag}: {e}"
  points = config_lib.grid(cfg, (("learning_rate", tuple(learning_rates)),))
  return (f"{flag}: {path!r} holds no run of the grid ({', '.join(cfg.arms)} in folders "
          f"like {points[0].name}/); is it that grid's workdir?")


PREMISE = "transformer_lr_premise_cpu"


def read(main: str, controls: str, preset: str = "transformer_lr_cpu", layer_norm: str = "",
         fine: str = ""):
  """(the analysis of the grids of `preset` (`grids.preset_grids`),
  {grid name: its workdir}); a ValueError of one line names a bad flag,
  workdir or file. The premise preset's grid is read from its two parts
  (`grids.read_premise`) and judged with its bands; `fine`, the
  transformer_lr_cpu grid's refinement, joins --main and brings the same
  bands."""
  from experiments.lr_threshold import threshold as th  # pylint: disable=g-import-not-at-top
  from experiments.lr_threshold import grids as grids_lib  # pylint: disable=g-import-not-at-top
  from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise  # pylint: disable=g-import-not-at-top
  plans = grids_lib.preset_grids(preset, layer_norm or None)
  if controls and "controls" not in plans:
    raise ValueError(f"--controls: the {preset} grid has every score in --main; give no "
                     "--controls.")
  if fine and preset != "transformer_lr_cpu":
    raise ValueError(f"--fine: only the transformer_lr_cpu grid has a refinement, not {preset}.")
  if preset == PREMISE:
    cfg, rates = plans["main"]
    problem = grid_problem("--main", os.path.join(main, grids_lib.COARSE), cfg, rates)
    if problem:
      raise ValueError(problem.replace(repr(os.path.join(main, grids_lib.COARSE)), repr(main), 1)
                       + f" (its coarse grid in {grids_lib.COARSE}/)")
    return (th.analyse(grids_lib.read_premise(main, cfg), bands=grids_lib.preset_bands(preset)),
            {"main": main})
  given = {"main": ("--main", main), "controls": ("--controls", controls)}
  inputs = {name: flag_path for name, flag_path in given.items() if flag_path[1]}
  for name, (flag, path) in inputs.items():
    problem = grid_problem(flag, path, *plans[name])
    if problem:
      raise ValueError(problem)
  grids = [grids_lib.read_grid(path, *plans[name]) for name, (_, path) in inputs.items()]
  if fine:
    if not os.path.isdir(fine):
      raise ValueError(f"--fine: no folder {fine!r}.")
    cfg, _ = plans["main"]
    grids[0] = grids_lib.union([grids[0], grids_lib.read_grid(fine, cfg, premise.GLOROT_FINE_RATES)])
    inputs["fine"] = ("--fine", fine)
  # The bands the preset pre-registered; the Glorot grid's refinement was
  # registered with the premise grid's, and is judged with them.
  bands = premise.BANDS if fine else grids_lib.preset_bands(preset)
  return (th.analyse(grids_lib.merge(grids), bands=bands),
          {name: path for name, (_, path) in inputs.items()})


def plan_lines(analysis) -> list[str]:
  """The premise grid's next runs, a line per (score, d_k): its score, d_k
  and every extra rate (planned beyond the coarse ones), which commands.sh
  passes to --sweep. A curve is listed where the rule asks for new rates
  (`adaptive.plan_next`) or where an extra rate it planned has not finished
  (`adaptive.unfinished`: an interrupted run, which the sweep resumes while
  skipping the finished ones). A coarse cell not finished is left to the
  coarse sweep, which commands.sh re-runs first."""
  from experiments.lr_threshold import adaptive  # pylint: disable=g-import-not-at-top
  from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise  # pylint: disable=g-import-not-at-top
  coarse = lambda lr: any(abs(lr - c) <= 1e-9 * c for c in premise.COARSE_RATES)
  asks = adaptive.plan_next(analysis)
  waiting = {key: rates for key, rates in adaptive.unfinished(analysis).items()
             if not all(coarse(lr) for lr in rates)}
  lines = []
  for score, dim in sorted(set(asks) | set(waiting)):
    planned = set(analysis.grid.planned(score, dim)) | set(asks.get((score, dim), ()))
    extra = sorted(lr for lr in planned if not coarse(lr))
    lines.append(f"{score} {dim} {','.join(repr(lr) for lr in extra)}")
  return lines


def write_problem(error: OSError, out: str, moved: int = 0) -> str:
  """One line for a report that could not be written into `out` (a full
  disk, a folder not writable), naming the file where known; `moved`: the
  files already in place (`files.Staging.moved`), 0 unless the renames
  themselves failed."""
  where = f" ({error.filename})" if error.filename else ""
  kept = ("the report there is left as it was" if not moved else
          f"{moved} of the new report's files are in place: the next report into it puts "
          "the rest there")
  return f"--out: cannot write the report into {out!r}: {error.strerror or error}{where}; {kept}."


def analysed_at(root: str) -> dict:
  """The provenance of this analysis (`provenance.fields`), with the commit
  and dirty state of the checkout `root` read now: before the report replaces
  its own files, since read after, a report kept in the tree (results/...)
  would call itself dirty (outside a checkout, the process's own record's).
  Its command is left out (null): it names the workdirs as given, folders
  of this machine, which the report names relative to --out (`inputs`)."""
  from attention_jax.measure import provenance  # pylint: disable=g-import-not-at-top
  made = {**provenance.fields(), "command": None}
  commit, dirty = provenance.git_state(root)
  if commit is not None:
    made.update(commit=commit, dirty=dirty)
  return made


def write(analysis, inputs: dict[str, str], out: str, log=print) -> list[str]:
  """The report of `analysis` (read from the workdirs `inputs`) into `out`;
  the names written. Its files (text, numbers, figures) are written into a
  staging folder and put in place together (`files.Staging`): a full disk,
  a failure or a stop asked while they are written (`interrupts`, checked
  before they are put in place) leaves the old report whole, and so does
  a report that is the same but for when it was made (`unchanged`; then no
  name is returned). A write that fails is a ValueError of one line
  (`write_problem`)."""
  from experiments.lr_threshold import plots as threshold_plots  # pylint: disable=g-import-not-at-top
  from experiments.lr_threshold import records  # pylint: disable=g-import-not-at-top
  from experiments.lr_threshold import tables as threshold_tables  # pylint: disable=g-import-not-at-top
  from attention_jax import files  # pylint: disable=g-import-not-at-top
  from attention_jax.training import interrupts  # pylint: disable=g-import-not-at-top
  made = analysed_at(ROOT)  # before this report replaces its own files
  stage = files.Staging(out, log=log)
  try:
    with stage:
      files.atomic_write(os.path.join(stage.path, MARKDOWN), threshold_tables.markdown(analysis))
      value = {"inputs": {name: os.path.relpath(path, out) for name, path in inputs.items()},
               "analysed_at": made, **records.as_json(analysis)}
      files.atomic_write(os.path.join(stage.path, JSON), files.to_json(value, indent=1))
      names = [MARKDOWN, JSON] + threshold_plots.plot_all(analysis, stage.path)
      interrupts.check()  # asked to stop while they were written: the old report stays
      kept = unchanged(stage.path, out, names)
      if kept is not None:
        log(f"{out}: the report there has the same numbers, tables and figures; kept as "
            f"analysed at {kept}")
        return []
      stage.commit(names)
  except OSError as e:
    raise ValueError(write_problem(e, out, stage.moved)) from None
  return names


def unchanged(new: str, out: str, names: list[str]) -> str | None:
  """The commit the report in `out` was analysed at, where it is the one
  staged in `new` but for when it was made (its JSON's `analysed_at`): every
  other file byte for byte the same, and made from a clean checkout. None
  where anything differs or is missing. So a report rewritten from the same runs keeps its commit, and
  the documents that quote it stay true."""
  import filecmp  # pylint: disable=g-import-not-at-top
  from attention_jax import files  # pylint: disable=g-import-not-at-top
  if set(names) - set(os.listdir(out)):
    return None
  for name in names:
    if name != JSON and not filecmp.cmp(os.path.join(new, name), os.path.join(out, name),
                                        shallow=False):
      return None
  try:
    fresh, held = (files.read_json(os.path.join(folder, JSON), dict) for folder in (new, out))
  except (OSError, ValueError):
    return None
  made = held.pop("analysed_at", None)
  fresh.pop("analysed_at", None)
  if fresh != held or not isinstance(made, dict) or made.get("dirty"):
    return None  # a report made from a dirty checkout gives way to a clean one
  commit = made.get("commit")
  return str(commit)[:7] if commit else str(made.get("date") or "an unknown time")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  # --plan writes nothing: any folder stands in for --out.
  problem = path_problem(FLAGS.main, FLAGS.controls, os.curdir if FLAGS.plan else FLAGS.out)
  if problem:
    sys.exit(f"error: {problem}")
  if FLAGS.plan and FLAGS.preset != PREMISE:
    sys.exit(f"error: --plan: only the {PREMISE} grid is adaptive, not {FLAGS.preset}.")
  try:
    analysis, inputs = read(FLAGS.main, FLAGS.controls, FLAGS.preset, FLAGS.layer_norm,
                            FLAGS.fine)
  except ValueError as e:
    sys.exit(f"error: {e}")
  if FLAGS.plan:
    print("\n".join(plan_lines(analysis)))
    return
  from attention_jax.training import interrupts  # pylint: disable=g-import-not-at-top
  # SIGTERM and Ctrl-C while the report is written: a request, honoured
  # before its files are put in place (a second one stops at once).
  interrupts.install()
  try:
    written = write(analysis, inputs, FLAGS.out)
  except interrupts.Interrupted as e:
    print(f"error: {e}; {FLAGS.out} keeps the report it held", file=sys.stderr)
    sys.exit(e.exit_code)
  except ValueError as e:
    sys.exit(f"error: {e}")
  if written:
    print(f"wrote {', '.join(written)} into {FLAGS.out}")
  signum = interrupts.requested()
  if signum is not None:  # it came once the new report was in place
    stop = interrupts.Interrupted(signum)
    print(f"error: {stop} after the new report was in place in {FLAGS.out}", file=sys.stderr)
    sys.exit(stop.exit_code)


if __name__ == "__main__":
  define_flags()
  app.run(main)
