#!/usr/bin/env bash
# Training throughput of the quick model (target tokens/s over training steps
# only, as the trainer logs it), before and after the loss and additive-backward
# changes made between 1c2a0b6 and 19c73eb, one process with XLA's default
# threads on an otherwise idle machine.
# Usage: results/throughput_cpu/measure.sh BEFORE_REV AFTER_REV > rows.tsv
# Each revision is checked out into a temporary git worktree and run with this
# checkout's .venv; each row is the median of the trainer's 50-step windows
# after the first (the first holds compilation).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
py="$repo/.venv/bin/python"
echo -e "rev\tarm\tdim\tseeds\ttarget_tok_per_s"
for rev in "$@"; do
  tree="$(mktemp -d)/tree"
  git -C "$repo" worktree add -q --detach "$tree" "$rev"
  for case in 128:1 128:2 1024:1; do
    dim=${case%:*} seeds=${case#*:}
    {
      log="$(cd "$tree" && PYTHONPATH="$tree" "$py" -m experiments.train --preset=quick \
          --arm=additive --dim="$dim" --seeds="$seeds" --steps=150 --log_every=50 \
          --learning_rate=3e-3 --warmup_steps=30 --beam_size=1 --eval_every=1000 \
          --eval_examples=10 --test_examples=10 --diag_every=1000 --checkpoint_every=1000 \
          --workdir="$(mktemp -d)" 2>&1)"
      rate="$(grep -o '[0-9,]* target tok/s' <<<"$log" | tail -n +2 | tr -d , | cut -d' ' -f1 \
              | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
      echo -e "$rev\tadditive\t$dim\t$seeds\t$rate"
    }
  done
  git -C "$repo" worktree remove --force "$tree"
done
