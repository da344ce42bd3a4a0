r"""One training run: one model, one score function, one attention dimension.

    python -m experiments.train --preset=smoke --arm=additive --dim=32 --workdir=/tmp/run
    python -m experiments.train --preset=quick --model=transformer --arm=scaled_dot --dim=64 \
        --seeds=1 --workdir=runs/transformer

Evaluation (validation BLEU every --eval_every steps, the best checkpoint's
test BLEU at the end) and Orbax checkpointing as in the ablation; re-running
resumes. Exit status as the ablation's (75: stopped by --max_minutes). The --seeds members train together as one vmapped program.
"""

from absl import app
from absl import flags

from experiments import common

flags.DEFINE_string("arm", "additive", "Score function of the attention.")
flags.DEFINE_integer("dim", 512, "Attention dimension a.")
common.define_flags()
FLAGS = flags.FLAGS


def main(argv):
  common.run_sweep(argv, {"arms": (FLAGS.arm,), "dims": (FLAGS.dim,)})


if __name__ == "__main__":
  app.run(main)
