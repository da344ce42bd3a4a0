r"""The additive-vs-multiplicative attention-dimensionality ablation (Britz et al. 2017).

    python -m experiments.ablation --preset=quick --workdir=runs/quick
    python -m experiments.ablation --preset=gpu --workdir=runs/gpu   # re-run to resume
    python -m experiments.ablation --preset=gpu --workdir=runs/gpu \
        --calibration=runs/gpu_plan/calibration.json    # steps, eval_every, dims measured
    python -m experiments.ablation --preset=smoke --arms=additive --dims=8 --workdir=/tmp/s
    python -m experiments.ablation --preset=quick --dims=1024 --workdir=runs/lr \
        --arms=additive,multiplicative,scaled_multiplicative,qk_norm \
        --sweep=learning_rate=3e-4,1e-3,3e-3      # a grid; --sweep again for more axes
    python -m experiments.ablation --preset=transformer_smoke --workdir=runs/lr_members \
        --members=learning_rate=1e-3,3e-3,1e-2    # the same grid's rows, one program per pair

Sweeps --arms x --dims; the --seeds of each pair train together as one
vmapped program. Re-running the same command skips finished pairs and resumes
an interrupted one from its last checkpoint. Exit status: 0 complete, 75
stopped by --max_minutes at a checkpoint (`common.EXIT_STOPPED`: re-run to
continue), 143 / 130 stopped by SIGTERM / Ctrl-C, 1 an error. `--sweep=FIELD=V1,V2,...` (any
config field, repeatable) makes a grid of such sweeps, one workdir per point
inside --workdir, with tables and plots of the arms against the first axis.
`--calibration` takes the `--steps`, `--eval_every` and `--dims` a calibration
(`experiments.calibration`) planned for this preset on this device,
so that its measurement becomes the sweep's settings without editing a preset
file; flags given beside it win. See attention_jax/sweep/workdir.py for the
workdir layout.
"""

import sys

from absl import app
from absl import flags

from attention_jax.sweep import plan as plan_lib
from experiments import common

flags.DEFINE_string("arms", None, "Comma-separated arms (score functions) to compare; "
                    "default from the preset (additive,multiplicative,scaled_multiplicative).")
flags.DEFINE_string("dims", None, "Comma-separated attention dimensions; default from the preset.")
flags.DEFINE_multi_string(
    "sweep", [], "FIELD=V1,V2,...: also sweep this config field (repeat for a grid), "
    "e.g. --sweep=learning_rate=3e-4,1e-3,3e-3; each grid point is a workdir "
    "<workdir>/<field>=<value>; tables pivot the arms against the first axis.")
flags.DEFINE_string("calibration", None, "calibration.json of experiments.calibration "
                    "for this preset: its plan's --steps, --eval_every and --dims "
                    "(each flag given here wins over it).")
flags.DEFINE_bool("report_only", False, "Rewrite the tables and plots of --workdir from its "
                  "finished runs; train nothing.")
flags.DEFINE_string("shard", "", "I/N: train this driver's share of the sweep's runs (run k "
                    "where k mod N = I), then any run no other driver holds; 'auto' (a SLURM "
                    "array task's) or 'auto/N' (SLURM's or Kubernetes' index). Any number of "
                    "drivers share the workdir, each run under its own lock (docs/cluster.md).")
common.define_flags()
FLAGS = flags.FLAGS


def planned(path: str | None, preset: str) -> dict:
  """The fields the calibration file at `path` plans (none without one), less
  those given as flags: a flag wins over the plan as it does over the preset."""
  if path is None:
    return {}
  fields = plan_lib.read_plan(path, preset)
  return {name: value for name, value in fields.items() if not FLAGS[name].present}


def main(argv):
  # Given as text: parsed with the other fields (`common.overrides`).
  extra = {name: FLAGS[name].value for name in ("arms", "dims") if FLAGS[name].value is not None}
  try:
    extra = {**planned(FLAGS.calibration, FLAGS.preset), **extra}
  except ValueError as e:
    sys.exit(f"error: {e}")
  common.run_sweep(argv, extra, FLAGS.sweep, report_only=FLAGS.report_only, shard=FLAGS.shard)


if __name__ == "__main__":
  app.run(main)
