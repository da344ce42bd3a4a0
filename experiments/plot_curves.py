r"""Validation BLEU and perplexity over training for several runs, side by side.

    python -m experiments.plot_curves --out=curves.png \
        --run="lr 3e-3=runs/a/runs/additive_d128/metrics.jsonl" \
        --run="lr 5e-3=runs/b/runs/additive_d128/metrics.jsonl"
    python -m experiments.plot_curves --out=lr.png \
        --run="dot=runs/lr_members/runs/dot_d8/metrics.jsonl" [--member=learning_rate=0.003]

Each `--run` is `LABEL=PATH` to a run's `metrics.jsonl`. A curve is the mean
over the run's seeds (the figure's title says which). A run of several
member values (`--members=learning_rate=...`) gives one curve per value,
labelled 'LABEL learning_rate=0.001', or only the value `--member` names.
"""

import os
import sys

from absl import app
from absl import flags

flags.DEFINE_multi_string("run", None, "LABEL=PATH of a metrics.jsonl; repeat for each run.")
flags.DEFINE_string("out", None, "Output PNG.")
flags.DEFINE_string("member", None, "FIELD=VALUE: of a run with member values (--members), "
                    "draw only the members of that value, e.g. learning_rate=0.003; "
                    "default: one curve per value.")
FLAGS = flags.FLAGS


def parse_member(text: str | None) -> dict[str, float] | None:
  """`--member` as {field: value}; a ValueError naming the flag if it is not
  FIELD=NUMBER of a member field."""
  if text is None:
    return None
  from attention_jax.training.run_config import MEMBER_FIELDS
  field, sep, value = text.partition("=")
  if not sep or field not in MEMBER_FIELDS:
    raise ValueError(f"`--member` must be FIELD=VALUE with FIELD one of "
                     f"{', '.join(MEMBER_FIELDS)}, got {text!r}.")
  try:
    return {field: float(value)}
  except ValueError:
    raise ValueError(f"`--member` {field}={value!r} is not a number.") from None


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  if not FLAGS.run or not FLAGS.out:
    sys.exit("error: `--run` (at least one) and `--out` are required.")
  try:
    member = parse_member(FLAGS.member)
  except ValueError as e:
    sys.exit(f"error: {e}")
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
  histories = {label: metrics_log.MetricsLog(path, write=False).read()
               for label, path in runs.items()}
  curves = plots.member_curves(histories, member)
  if not any(curves.values()):
    values = sorted({plots.member_values(r) for rows in histories.values() for r in rows})
    sys.exit(f"error: `--member` {FLAGS.member} matches no line of the runs; their member "
             f"values: {', '.join(', '.join(f'{k}={v:g}' for k, v in vs) for vs in values)}.")
  note = plots.seeds_note(curves)
  plots.plot_validation(curves, list(curves), FLAGS.out, note=note)
  print(f"wrote {FLAGS.out}: {len(curves)} curve{'s' if len(curves) != 1 else ''} "
        f"({'; '.join(curves)}), each the {note}")


if __name__ == "__main__":
  app.run(main)
