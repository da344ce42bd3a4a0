#!/usr/bin/env bash
# The Transformer's d_k ablation on CPU (README.md): the data, the driver, the
# extension rule fixed in the preset before any result, and the copies of each
# stage's reports in this folder.
#
#   bash results/transformer_cpu/commands.sh [WORKDIR [STEPS]]  # runs/transformer 1500
#
# From the repository's top folder. The rule: every run goes on by 500 steps
# (`--steps` on the same workdir: under the constant schedule that is the run
# of that length) while a `scaled_dot` run ends with best validation BLEU
# (`val_bleu` of results.jsonl) below 12. It fired once, at 1,500 steps, and
# not at 2,000. Stopped, it resumes when run again with the stage it was at as
# STEPS (finished runs are skipped, the others go on from their last
# checkpoint; a run cannot be shortened, so not with an earlier stage).
#
# The result in this folder was made by two scripts outside the repository
# (chain.sh, chain2.sh; segments.log has their starts, stops and the rule's
# verdicts) that ran these commands in a workdir of the machine; this file
# runs the same commands in one place. The `results.jsonl` there had no
# provenance yet: it was added to the committed rows afterwards (README.md);
# the driver now writes it itself.
set -euo pipefail
workdir=${1:-runs/transformer}
here=results/transformer_cpu
python -m experiments.prepare_data --vocab_size=2000

steps=${2:-1500}  # 1500: the preset's
while :; do
  mkdir -p "$here/steps$steps"
  python -m experiments.ablation --preset=transformer --workdir="$workdir" --steps=$steps \
    2>&1 | tee "$here/steps$steps/ablation.log"
  for f in table.md results.jsonl ablation.png validation.png diagnostics.png; do
    cp "$workdir/$f" "$here/steps$steps/"
  done
  python -m experiments.attention_kinds --preset=transformer --workdir="$workdir" \
    --last_step=$steps > "$here/steps$steps/kinds.md"
  # The rule: how many scaled_dot runs of this length end below BLEU 12.
  below=$(python -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(sum(r["arm"] == "scaled_dot" and r["steps"] == int(sys.argv[2]) and r["val_bleu"] < 12
          for r in rows))' "$workdir/results.jsonl" "$steps")
  if [ "$below" = 0 ]; then
    break
  fi
  echo "rule at $steps steps fires ($below scaled_dot runs below 12): extending every run"
  steps=$((steps + 500))
done
echo "rule at $steps steps: every scaled_dot run has best validation BLEU >= 12; done"
# The final stage keeps every run's metrics log too.
mkdir -p "$here/steps$steps/metrics"
for log in "$workdir"/runs/*/metrics.jsonl; do
  cp "$log" "$here/steps$steps/metrics/$(basename "$(dirname "$log")").jsonl"
done
