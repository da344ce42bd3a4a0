#!/usr/bin/env bash
# The quick RNN's training step against the machine's matmul peak, before and after.
#
#   bash results/cpu_efficiency/measure.sh BEFORE AFTER [FOLDER]   # e.g. da94428 HEAD
#
# Checks both commits out into a temporary folder; the measuring code
# (experiments/cpu_efficiency/run.py and what it imports that BEFORE lacks) is
# AFTER's in both trees, so only the model and the trainer differ. Each tree
# runs as its own code trained: a BEFORE without training/host_memory.py keeps
# glibc's allocator defaults (--keep_freed_memory=false), and a BEFORE whose
# workers were not pinned to a core (no `use_one_core`) runs its two processes
# on every core (they asked XLA for one thread, which jax 0.10.2's matmuls
# ignore). Run it on an idle machine (nothing else busy): about 10 minutes on 2 cores.
#  1. one process on core 0, each commit in turn: 4 cells x 1 and 2 seeds;
#  2. two processes at once, as `--workers=2` trains; 2 seeds, two cells.
# Appends to FOLDER/{one_core,two_workers}_{before,after}.jsonl (FOLDER:
# results/cpu_efficiency by default).
set -euo pipefail
before=$(git rev-parse --short "${1:?BEFORE commit}")
after=$(git rev-parse --short "${2:?AFTER commit}")
root=$(git rev-parse --show-toplevel)
out=$(realpath -m "${3:-$root/results/cpu_efficiency}")
mkdir -p "$out"
py=$root/.venv/bin/python
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/before" >/dev/null 2>&1 || true;
      git -C "$root" worktree remove --force "$tmp/after" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add -f --detach "$tmp/before" "$before" >/dev/null
git -C "$root" worktree add -f --detach "$tmp/after" "$after" >/dev/null
own_flags=()  # how BEFORE's own code trained (see the top)
[ -e "$tmp/before/attention_jax/training/host_memory.py" ] || own_flags+=(--keep_freed_memory=false)
if grep -q "def use_one_core" "$tmp/before/attention_jax/training/workers.py" 2>/dev/null; then
  pair_flags=(--core=0 --core=1)
else
  pair_flags=(--threads=0 --threads=0)
fi
for f in attention_jax/measure/flops.py attention_jax/measure/benchmarking.py attention_jax/training/workers.py \
         attention_jax/training/host_memory.py attention_jax/measure/hlo.py \
         attention_jax/measure/hlo_profile.py experiments/cpu_efficiency/run.py; do
  mkdir -p "$(dirname "$tmp/before/$f")"
  git -C "$root" show "$after:$f" > "$tmp/before/$f"
done
measure() {  # TREE LABEL FLAGS...
  local tree=$1 label=$2; shift 2
  local extra=()
  [ "$tree" = before ] && extra=("${own_flags[@]}")
  (cd "$tmp/$tree" && PYTHONPATH=. "$py" -m experiments.cpu_efficiency.run "$@" ${extra[@]+"${extra[@]}"} \
     2>/dev/null)
}
for tree in before after; do
  commit=$([ $tree = before ] && echo "$before" || echo "$after")
  echo "== one core, $tree ($commit)"
  measure $tree $tree --core=0 --batches=10 --out="$out/one_core_${tree}.jsonl"
done
cells=multiplicative:128,additive:1024
pair() {  # TREE FLAG_OF_PROCESS_0 FLAG_OF_PROCESS_1: two processes at once
  local tree=$1 common="--cells=$cells --seeds=2 --batches=10"
  measure "$tree" "$tree" "$2" $common --out="$out/two_workers_$tree.jsonl" > "$tmp/${tree}0.txt" &
  measure "$tree" "$tree" "$3" $common --out="$out/two_workers_$tree.jsonl.2" > "$tmp/${tree}1.txt"
  wait
}
echo "== two processes at once, before ($before): ${pair_flags[*]}"
pair before "${pair_flags[@]}"
echo "== two processes at once, after ($after): one core each"
pair after --core=0 --core=1
for f in before after; do  # one file per setting; the two processes' rows one after the other
  cat "$out/two_workers_$f.jsonl.2" >> "$out/two_workers_$f.jsonl" && rm "$out/two_workers_$f.jsonl.2"
done
cat "$tmp"/before0.txt "$tmp"/before1.txt "$tmp"/after0.txt "$tmp"/after1.txt
