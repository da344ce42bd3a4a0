#!/usr/bin/env bash
# The recipe search behind the quick preset (its first round): additive a = 128, one
# seed, greedy validation BLEU on the first 200 validation verses and
# perplexity on the whole validation split every 250 steps. Run on the 2-core
# CPU machine, two runs at a time, one per core, single-threaded XLA, with the
# uncommitted working tree that became commit a8b1a66: R0 and R2 ran before the
# perplexity evaluation was added (their rows have no val_ppl), R3-R6 after. metrics/<NAME>.jsonl here is each run's
# runs/additive_d128/metrics.jsonl. Every setting not named is the quick
# preset's (embedding/hidden 128, vocab 2000, batch 64, max_length 32,
# dropout 0.1).
mkdir -p runs/rec runs/probe
run() {
  local name=$1 core=$2; shift 2
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
  taskset -c "$core" python -m experiments.train --preset=quick --arm=additive --dim=128 \
    --seeds=1 --beam_size=1 --eval_every=250 --eval_examples=200 \
    --test_examples=300 --diag_every=250 --checkpoint_every=1000 --log_every=250 \
    --workdir="runs/rec/$name" "$@" > "runs/rec/$name.log" 2>&1
}
run R0 0 --steps=2000 --learning_rate=3e-3 --warmup_steps=30 &        # the recipe before
run R2_len40 1 --steps=2000 --learning_rate=3e-3 --warmup_steps=30 --max_length=40; wait
run R3_lr5e-3 0 --steps=1500 --learning_rate=5e-3 --warmup_steps=100 &  # chosen
run R4_drop0 1 --steps=1500 --learning_rate=3e-3 --warmup_steps=30 --dropout=0; wait
run R5_lr1e-2 0 --steps=1250 --learning_rate=1e-2 --warmup_steps=200 &
run R6_lr5e-3_b32 1 --steps=2000 --learning_rate=5e-3 --warmup_steps=100 --batch_size=32; wait

# Probes for the learning rate of the quick preset (its second round): the
# lr 5e-3 quick table (commit 19c73eb) left scaled_multiplicative at ~4 BLEU
# with saturated softmax rows, so the lr was probed on the scaled baseline at
# a = 1024, one seed, 100 warm-up steps, with the code of commit a6fdc03 (plus
# reliability changes that do not touch the numbers); validation every 500
# steps. metrics/P<k>.jsonl here is each run's
# runs/<arm>_d<dim>/metrics.jsonl. P3 and P4 were stopped by the end of the
# session at steps 700 and 1200 (lr 1e-3: too slow, validation BLEU < 0.1 at
# step 500 for P3 and at step 1000 for P4).
probe() {
  local name=$1 core=$2 arm=$3 dim=$4 steps=$5; shift 5
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
  taskset -c "$core" python -m experiments.train --preset=quick --arm=$arm --dim=$dim \
    --seeds=1 --steps=$steps --eval_every=500 --eval_examples=200 --test_examples=300 \
    --beam_size=1 --diag_every=100 --checkpoint_every=100000 --log_every=100 \
    --workdir="runs/probe/$name" "$@" > "runs/probe/$name.log" 2>&1
}
probe P1_scaled1024_lr2e-3 0 scaled_multiplicative 1024 2000 --learning_rate=2e-3 &  # test 9.03
probe P2_scaled1024_lr3e-3 1 scaled_multiplicative 1024 2000 --learning_rate=3e-3; wait  # test 12.94
probe P3_scaled1024_lr1e-3 0 scaled_multiplicative 1024 3000 --learning_rate=1e-3 &
probe P4_additive128_lr1e-3 1 additive 128 3000 --learning_rate=1e-3; wait
