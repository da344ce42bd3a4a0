#!/usr/bin/env bash
# The learning-rate experiment (is the collapse at a = 1024 a matter of the
# dimension or of the dimension times the learning rate, and does QKNorm cure
# it?), as run on the 2-core CPU machine.
#
#   bash results/lr_cpu/commands.sh run       # the pieces below, in order
#   bash results/lr_cpu/commands.sh collect   # copy them here, rewrite the tables
#
# Every point is the quick preset (README: RNN, embedding/hidden 128, vocab
# 2000, 2500 steps, 100 warm-up steps, constant lr after warm-up, 2 vmapped
# seeds, test BLEU with beam 4 on 500 test verses) with only the learning
# rate changed, for every arm alike. The layout is that of
#
#   python -m experiments.ablation --preset=quick --workdir=W \
#     --arms=additive,multiplicative,scaled_multiplicative,qk_norm --dims=128,1024 \
#     --sweep=learning_rate=3e-4,1e-3,3e-3
#
# (W/learning_rate=<value>/ is an ordinary ablation workdir per grid point),
# so the pieces, run one at a time (two pairs at once, one per core), are
# skipped as finished by that grid command, which then trains what is missing.
set -euo pipefail
W=${W:-runs/lr_cpu}
PY=${PY:-.venv/bin/python}
HERE=results/lr_cpu

# --steps=2500 was the quick preset's own value at d85915b (a no-op then); it is
# explicit so that the commands give the same runs with later code, whose quick
# preset runs 3500 steps.
piece() {
  local lr=$1 arms=$2 dims=$3  # a pair already finished there is skipped
  "$PY" -m experiments.ablation --preset=quick --steps=2500 --arms="$arms" --dims="$dims" \
    --learning_rate="$lr" --workdir="$W/learning_rate=$lr"
}

run() {
  # Session of 2026-11-23, code of commit d85915b (qk_norm and max_logit, before
  # --sweep and TensorBoard existed; the later commits change no number):
  piece 0.0003 additive,multiplicative 1024    # 11:00-11:57
  piece 0.003 multiplicative,qk_norm 1024      # 11:57-12:47; multiplicative re-runs quick_cpu's cell
  # one pair alone, started on the core piece 2 had freed; single-threaded like a worker:
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
    piece 0.0003 multiplicative 128              # 12:39-13:07 (the small-dimension control)
  piece 0.001 additive,multiplicative 128      # 13:08-13:36
  # Session of 2026-11-23 (third), the same code (a frozen worktree of d85915b):
  piece 0.001 additive,multiplicative 1024     # 14:35-15:23
  piece 0.001 scaled_multiplicative,qk_norm 1024  # 15:23-16:04
  piece 0.001 scaled_multiplicative,qk_norm 128   # 16:04-16:33
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
    piece 0.003 qk_norm 128                      # 16:33-16:58 (one pair, beside a test run)
  # Session of 2026-11-23 (fourth), the same code (a frozen worktree of d85915b); five
  # pairs through two workers, largest dimension first; piece 10 started on the core
  # piece 9's last pair left free, so three pairs shared the two cores 18:31-19:02:
  piece 0.0003 additive,scaled_multiplicative,qk_norm 128,1024  # 17:18-19:02
  piece 0.003 additive,scaled_multiplicative 1024               # 18:31-19:34
  piece 0.003 additive,multiplicative,scaled_multiplicative 128 # 19:42-20:17 (two pairs by 20:13; killed at the session end), re-run 20:24-20:50 (resumed the last pair at step 750)
}

collect() {  # the finished runs (no checkpoints), then the grid's reports (no training)
  # test_translations.json is kept gzip'd (.json.gz, which the reports read).
  (cd "$W" && find . -path '*/runs/*/result.json') | while read -r done_run; do
    run_dir=$(dirname "$done_run")  # a run still training elsewhere is left out
    (cd "$W/$run_dir" && find . -path ./checkpoints -prune -o -type f -print) |
      while read -r f; do
        mkdir -p "$HERE/$run_dir/$(dirname "$f")"
        if [ "$(basename "$f")" = test_translations.json ]; then
          gzip -9 -n -c "$W/$run_dir/$f" > "$HERE/$run_dir/$f.gz"
          rm -f "$HERE/$run_dir/$f"
        else
          cp "$W/$run_dir/$f" "$HERE/$run_dir/$f"
        fi
      done
  done
  "$PY" -m experiments.ablation --preset=quick --steps=2500 --workdir="$HERE" --report_only \
    --arms=additive,multiplicative,scaled_multiplicative,qk_norm --dims=128,1024 \
    --sweep=learning_rate=3e-4,1e-3,3e-3
}

"${1:?usage: commands.sh run|collect}"
