r"""Validation BLEU and perplexity over training for several runs, side by side.

    python -m experiments.plot_curves --out=curves.png \
        --run="lr 3e-3=runs/a/runs/additive_d128/metrics.jsonl" \
        --run="lr 5e-3=runs/b/runs/additive_d128/metrics.jsonl"

Each `--run` is `LABEL=PATH` to a run's `metrics.jsonl` (seeds averaged).
"""

import os
import sys

from absl import app
from absl import flags

flags.DEFINE_multi_string("run", None, "LABEL=PATH of a metrics.jsonl; repeat for each run.")
flags.DEFINE_string("out", None, "Output PNG.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  if not FLAGS.run or not FLAGS.out:
    sys.exit("error: `--run` (at least one) and `--out` are required.")
  runs = {}
  for spec in FLAGS.run:
    label, sep, path = spec.rpartition("=")  # the label may contain "="
    if not sep or not label:
      sys.exit(f"error: `--run` must be LABEL=PATH, got {spec!r}.")
    if not os.path.isfile(path):
      sys.exit(f"error: `--run` {label!r}: no file {path!r}.")
    runs[label] = path
  from attention_jax.analysis import plots  # heavy imports after the checks
  from attention_jax.training import metrics_log
  histories = {label: metrics_log.MetricsLog(path).read() for label, path in runs.items()}
  plots.plot_validation(histories, list(runs), FLAGS.out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
