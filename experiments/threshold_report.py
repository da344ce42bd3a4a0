r"""The learning-rate x d_k analysis of the `transformer_lr_cpu` grid, or of the
`transformer_lr` grid of one layer norm.

    python -m experiments.threshold_report --main=W/main --controls=W/controls \
        --out=OUT
    python -m experiments.threshold_report --preset=transformer_lr --layer_norm=pre \
        --main=runs/transformer_lr/pre --out=OUT

reads the two workdirs that results/transformer_lr_cpu/commands.sh trains
(finished or still running; `--controls=` leaves the controls out), or the
workdir of one layer norm of `transformer_lr` (its every score, as a
`--sweep=learning_rate=...` grid or as `--members` runs; the preset's
docstring has both commands), and
writes into --out (created): lr_threshold.md (the tables), lr_threshold.json
(every number, and the provenance its result rows record) and the figures.
The rule is the preset's docstring, applied by `attention_jax.analysis.
threshold`; cells not yet known are listed and left out. The outputs name
no folder of this machine: the inputs are given relative to --out.
"""

import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
MARKDOWN = "lr_threshold.md"
JSON = "lr_threshold.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def define_flags() -> None:
  """Defined only when this module is the program: drivers that tests import
  beside it define `--out` too."""
  flags.DEFINE_string("main", None, "Workdir of the main grid (dot, scaled_dot).")
  flags.DEFINE_string("controls", "", "Workdir of the controls grid (inverse_dim, qk_norm); "
                      "empty: left out.")
  flags.DEFINE_string("out", None, "Output folder (created).")
  flags.DEFINE_string("preset", "transformer_lr_cpu", "The preset whose grid --main holds: "
                      "transformer_lr_cpu (main and controls grids) or transformer_lr (every "
                      "score in --main, one layer norm).")
  flags.DEFINE_string("layer_norm", "", "post or pre: the layer norm the grid was trained "
                      "with (default the preset's).")


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
  """Why `path` is not a workdir of the grid (no run folder of its plan, as
  a `--sweep` grid or as `--members` runs); None if it holds one. A swapped
  --main and --controls is caught here."""
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import workdir as workdir_lib
  workdir = workdir_lib.Workdir(path)
  points = config_lib.grid(cfg, (("learning_rate", tuple(learning_rates)),))
  if any(os.path.isdir(workdir.point(p).run(arm).path)
         for p in points for arm in p.config.sweep()):
    return None
  if any(os.path.isdir(workdir.run(arm).path) for arm in cfg.sweep()):
    return None
  return (f"{flag}: {path!r} holds no run of the grid ({', '.join(cfg.arms)} in folders "
          f"like {points[0].name}/); is it that grid's workdir?")


def read(main: str, controls: str, preset: str = "transformer_lr_cpu", layer_norm: str = ""):
  """(the analysis of the grids of `preset` (`threshold.preset_grids`),
  {grid name: its workdir}); a ValueError of one line names a bad flag,
  workdir or file."""
  from attention_jax.analysis import threshold as th  # pylint: disable=g-import-not-at-top
  plans = th.preset_grids(preset, layer_norm or None)
  if controls and "controls" not in plans:
    raise ValueError(f"--controls: the {preset} grid has every score in --main; give no "
                     "--controls.")
  given = {"main": ("--main", main), "controls": ("--controls", controls)}
  inputs = {name: flag_path for name, flag_path in given.items() if flag_path[1]}
  for name, (flag, path) in inputs.items():
    problem = grid_problem(flag, path, *plans[name])
    if problem:
      raise ValueError(problem)
  grids = [th.read_grid(path, *plans[name]) for name, (_, path) in inputs.items()]
  return th.analyse(th.merge(grids)), {name: path for name, (_, path) in inputs.items()}


def write(analysis, inputs: dict[str, str], out: str) -> list[str]:
  """The report of `analysis` (read from the workdirs `inputs`) into `out`;
  the names written."""
  from attention_jax.analysis import threshold as th  # pylint: disable=g-import-not-at-top
  from attention_jax.analysis import threshold_plots  # pylint: disable=g-import-not-at-top
  from attention_jax.analysis import threshold_tables  # pylint: disable=g-import-not-at-top
  from attention_jax.training import files  # pylint: disable=g-import-not-at-top
  from attention_jax.training import provenance  # pylint: disable=g-import-not-at-top
  # The checkout as it is before this report replaces its own files: read
  # after, a report kept in the tree (results/...) would call itself dirty.
  commit, dirty = provenance.git_state(ROOT)
  os.makedirs(out, exist_ok=True)
  files.atomic_write(os.path.join(out, MARKDOWN), threshold_tables.markdown(analysis))
  value = {"inputs": {name: os.path.relpath(path, out) for name, path in inputs.items()},
           "analysed_at": {"commit": commit, "dirty": dirty}, **th.as_json(analysis)}
  files.atomic_write(os.path.join(out, JSON), files.to_json(value, indent=1))
  return [MARKDOWN, JSON] + threshold_plots.plot_all(analysis, out)


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  problem = path_problem(FLAGS.main, FLAGS.controls, FLAGS.out)
  if problem:
    sys.exit(f"error: {problem}")
  try:
    analysis, inputs = read(FLAGS.main, FLAGS.controls, FLAGS.preset, FLAGS.layer_norm)
  except ValueError as e:
    sys.exit(f"error: {e}")
  written = write(analysis, inputs, FLAGS.out)
  print(f"wrote {', '.join(written)} into {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
