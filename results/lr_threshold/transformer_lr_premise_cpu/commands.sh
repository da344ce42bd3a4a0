#!/usr/bin/env bash
# The 1/d_k law under its premise (preset `transformer_lr_premise_cpu`; its
# docstring holds the rule, the rates and the verdict bands, fixed before any
# run) and the Glorot grid's refinement. Run from the repository root:
#   bash results/lr_threshold/transformer_lr_premise_cpu/commands.sh run      # trains (resumable: re-run it)
#   bash results/lr_threshold/transformer_lr_premise_cpu/commands.sh plan     # the runs to train next
#   bash results/lr_threshold/transformer_lr_premise_cpu/commands.sh copy     # finished runs into results/, reports
#   bash results/lr_threshold/transformer_lr_premise_cpu/commands.sh seed     # committed runs into W (a fresh machine)
# `seed` is `copy` backwards, for a machine whose W lacks runs that results/ holds: each
# committed run folder W does not have is copied there (never over one it has), so that
# `run` skips it (a run with result.json is finished) and plans from it.
# W (default runs/transformer_lr_premise_cpu) holds coarse/ (the coarse --sweep grid),
# extra/<score>_d<dim>/ (the rates the rule added to that pair) and glorot_fine/ (the
# transformer_lr_cpu grid's dot and scaled_dot at 1.8e-3, 5.6e-3, 1.8e-2); PY the
# project's Python. A round of the rule's runs trains two (score, d_k) pairs at once,
# each pinned to a core of its own, as the coarse grid's two workers are. A round also
# resumes the rule's runs that a kill or a restart interrupted (planned, no result.json);
# a round that leaves the same runs unfinished stops the loop with their names.
# `copy` brings each finished run's files (never its checkpoints) into
# results/lr_threshold/transformer_lr_premise_cpu/{coarse,extra} and results/lr_threshold/transformer_lr_cpu/fine,
# so that a fresh clone skips those runs, then writes both reports from the committed
# runs, and side_by_side.md: the two grids' reports beside each other (the Glorot grid's
# refined report once every cell of it is known, its committed one before). test_translations.json is
# kept gzip'd (.json.gz, which the reports read).
set -euo pipefail
W="${W:-runs/transformer_lr_premise_cpu}"
PY="${PY:-.venv/bin/python}"
HERE=results/lr_threshold/transformer_lr_premise_cpu
GLOROT=results/lr_threshold/transformer_lr_cpu
COARSE_LRS=1e-4,3.2e-4,1e-3,3.2e-3,1e-2,3.2e-2
FINE_LRS=1.8e-3,5.6e-3,1.8e-2
PRESET=transformer_lr_premise_cpu
# shellcheck source=../../../scripts/copy_runs.sh
source "$(dirname "$0")/../../../scripts/copy_runs.sh"
# attention.json (test sentence 0's alignment) gzip'd too: no report of these grids reads it.
GZIP_FILES="test_translations.json attention.json"

plan() {  # $1: the premise grid's root; prints "SCORE DIM RATES" lines
  "$PY" -m experiments.lr_threshold.report --preset=$PRESET --main="$1" --plan
}

extra_lane() {  # $1: core; stdin: plan lines, each trained in turn on that core
  local score dim rates
  while read -r score dim rates; do
    [ -n "$score" ] || continue
    taskset -c "$1" "$PY" -m experiments.ablation --preset=$PRESET \
        --workdir="$W/extra/${score}_d$dim" --arms="$score" --dims="$dim" --baseline="$score" \
        --workers=1 --sweep=learning_rate="$rates"
  done
}

reports() {  # $1: premise root, $2: Glorot main, $3: Glorot controls, $4: Glorot fine, $5 $6: outs
  local refined=""  # the Glorot grid's refined report, which side_by_side uses once complete
  "$PY" -m experiments.lr_threshold.report --preset=$PRESET --main="$1" --out="$5"
  if [ -d "$4" ]; then
    "$PY" -m experiments.lr_threshold.report --main="$2" --controls="$3" --fine="$4" --out="$6"
    refined="$6"
  fi
  "$PY" -m experiments.lr_threshold.side_by_side --glorot="$GLOROT" --glorot_refined="$refined" \
      --premise="$5" --out="$5/side_by_side.md"
}

seed_runs() {  # $1: committed runs (results/...), $2: W's folder for them
  local result run rel
  [ -d "$1" ] || return 0
  find "$1" -path '*/runs/*/result.json' | sort | while read -r result; do
    run=$(dirname "$result")
    rel=${run#"$1"/}
    if [ -e "$2/$rel" ]; then continue; fi
    mkdir -p "$(dirname "$2/$rel")"
    cp -r "$run" "$2/$rel.tmp-seed" && mv "$2/$rel.tmp-seed" "$2/$rel"
    echo "seeded $2/$rel"
  done
}

case "${1:-}" in
  run)
    "$PY" -m experiments.ablation --preset=$PRESET --workdir="$W/coarse" \
        --sweep=learning_rate=$COARSE_LRS
    last=""
    while true; do
      lines=$(plan "$W")
      [ -n "$lines" ] || break
      if [ "$lines" = "$last" ]; then
        echo "error: the round just trained left these unfinished: $lines" >&2
        exit 1
      fi
      last="$lines"
      echo "the rule asks for: $lines"
      printf '%s\n' "$lines" | awk 'NR % 2 == 1' | extra_lane 0 &
      first=$!
      printf '%s\n' "$lines" | awk 'NR % 2 == 0' | extra_lane 1
      wait "$first"
    done
    echo "the premise grid is complete by its rule"
    "$PY" -m experiments.ablation --preset=transformer_lr_cpu --workdir="$W/glorot_fine" \
        --arms=dot,scaled_dot --sweep=learning_rate=$FINE_LRS ;;
  plan) plan "$W" ;;
  collect)
    reports "$W" "$GLOROT/main" "$GLOROT/controls" "$W/glorot_fine" "$W/report" "$W/report_glorot" ;;
  copy)
    copy_finished_runs "$W/coarse" "$HERE/coarse" "$HERE/coarse"
    [ ! -d "$W/extra" ] || for pair in "$W"/extra/*/; do
      copy_finished_runs "${pair%/}" "$HERE/extra/$(basename "$pair")" \
          "$HERE/extra/$(basename "$pair")"
    done
    copy_finished_runs "$W/glorot_fine" "$GLOROT/fine" "$GLOROT/fine"
    if [ -d "$HERE/coarse" ]; then
      reports "$HERE" "$GLOROT/main" "$GLOROT/controls" "$GLOROT/fine" "$HERE" "$GLOROT/refined"
    fi ;;
  seed)
    seed_runs "$HERE/coarse" "$W/coarse"
    [ ! -d "$HERE/extra" ] || for pair in "$HERE"/extra/*/; do
      seed_runs "${pair%/}" "$W/extra/$(basename "$pair")"
    done
    seed_runs "$GLOROT/fine" "$W/glorot_fine" ;;
  *) echo "usage: $0 run|plan|collect|copy|seed" >&2; exit 2 ;;
esac
