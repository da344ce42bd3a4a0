r"""Which attention kind's logits grow first, and when, in a Transformer sweep.

    python -m experiments.attention_kinds --preset=transformer --workdir=runs/transformer \
        > results/transformer_cpu/steps2000/kinds.md
    python -m experiments.attention_kinds --preset=transformer --workdir=runs/transformer \
        --last_step=1500        # the tables of the run before its extension
    python -m experiments.attention_kinds --preset=transformer_lr_cpu --workdir=W \
        --sweep=learning_rate=...     # a grid: a section per point

Reads the metrics logs of the runs of `--preset` (with the flags given, as
`experiments.ablation` takes them: the same command line finds the same
runs) in `--workdir`, finished or still running, and prints Markdown tables
of each attention kind's softmax diagnostics over training
(`attention_jax.analysis.attention_kinds`). Trains nothing and writes
nothing. The step-0 values of the same models are in results/init_logits
(`experiments.init_logits.run`).
"""

import math
import os
import sys

from absl import app
from absl import flags

from experiments import common

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line of the sweep driver (`--preset`, `--workdir`, a flag per
  config field, `--arms`, `--dims`, `--sweep`) and `--last_step`; defined only
  when this module is the program, since the drivers define the same names."""
  flags.DEFINE_string("arms", None, "Comma-separated arms; default from the preset.")
  flags.DEFINE_string("dims", None, "Comma-separated attention dimensions; default from the "
                      "preset.")
  flags.DEFINE_multi_string("sweep", [], "FIELD=V1,V2,...: the grid's axes, as the sweep was "
                            "run with them (a section per grid point).")
  flags.DEFINE_integer("last_step", None, "Leave out the steps after this one (the tables of "
                       "a run before it was extended).")
  common.define_flags()


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  from attention_jax.analysis import attention_kinds  # pylint: disable=g-import-not-at-top
  extra = {name: FLAGS[name].value for name in ("arms", "dims") if FLAGS[name].value is not None}
  cfg, axes = common.build_config(extra, FLAGS.sweep)
  if not os.path.isdir(FLAGS.workdir):
    sys.exit(f"error: `--workdir` {FLAGS.workdir} is not a folder.")
  if FLAGS.last_step is not None and FLAGS.last_step < 0:
    sys.exit(f"error: `--last_step` must be >= 0, got {FLAGS.last_step}.")
  last_step = math.inf if FLAGS.last_step is None else FLAGS.last_step
  points = attention_kinds.grid_histories(FLAGS.workdir, cfg, axes, last_step)
  try:
    text = attention_kinds.grid_markdown(points)
  except ValueError:
    sys.exit(f"error: `--workdir` {FLAGS.workdir} holds no run of --preset={FLAGS.preset} "
             "(with the flags given) that logged attention diagnostics.")
  sys.stdout.write(text)


if __name__ == "__main__":
  define_flags()
  app.run(main)
