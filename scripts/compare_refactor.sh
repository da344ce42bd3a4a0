#!/usr/bin/env bash
# Same outputs on the same seeds before and after a refactor:
#   PYTHON=.venv/bin/python bash scripts/compare_refactor.sh a34e656   # from the repository root
# (its outputs: results/refactor_check_cpu/ for the trainer/sweep/scores redesign,
# results/archive/refactor_check/ for the refactor of commit db6c306)
# Runs two small smoke sweeps -- the RNN (3 arms, a=8) and the Transformer (3 arms,
# d_k=8), 2 seeds, 40 steps -- with the code of commit $1 (a temporary git worktree)
# and with the working tree, then compares, per sweep: results.jsonl (every field but
# train_seconds and provenance), every run's metrics.jsonl byte for byte, and table.md.
# Then, per sweep, a workdir made by commit $1 resumes under the working tree: $1
# trains the first 20 steps, the working tree extends that workdir to 40 (restoring
# its checkpoints and reading its config.json), and the outputs must again equal
# those of the working tree's run from scratch.
# Exits 1 if anything differs.
set -euo pipefail
before_commit=$1
py=${PYTHON:-.venv/bin/python}
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # absolute, not resolved (a venv's python is a link)
root=$(pwd)
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/src" "$before_commit"
common="--preset=smoke --dims=8 --steps=40 --eval_every=20 --checkpoint_every=20 --diag_every=20"
declare -A sweeps=(
  [rnn]="--model=rnn --arms=additive,multiplicative,scaled_multiplicative"
  [transformer]="--model=transformer --arms=dot,scaled_dot,qk_norm"
)
# compare.py A B [verbose]: results.jsonl (all fields but train_seconds and provenance),
# every run's metrics.jsonl byte for byte and table.md of workdir B against A; exit 1 if any differ.
cat > "$tmp/compare.py" <<'PY'
import glob, json, os, sys
a_dir, b_dir, verbose = sys.argv[1], sys.argv[2], len(sys.argv) > 3
def rows(w):
  out = {}
  for line in open(f"{w}/results.jsonl"):
    r = json.loads(line); r.pop("train_seconds", None); r.pop("provenance", None)
    out[(r["arm"], r["dim"], r["seed"])] = r
  return out
a, b = rows(a_dir), rows(b_dir)
same_rows = a == b
print("  results.jsonl rows", len(a), len(b),
      "identical (all fields but train_seconds, provenance):", same_rows)
if verbose:
  for k in sorted(a):
    print("   ", k, "test_bleu", a[k]["test_bleu"], b.get(k, {}).get("test_bleu"),
          "val_ppl", a[k]["val_ppl"], b.get(k, {}).get("val_ppl"))
logs = sorted(os.path.relpath(p, a_dir) for p in glob.glob(f"{a_dir}/runs/*/metrics.jsonl"))
same_logs = bool(logs)
for rel in logs:
  other = os.path.join(b_dir, rel)
  same = os.path.exists(other) and open(os.path.join(a_dir, rel), "rb").read() == open(other, "rb").read()
  same_logs &= same
  print("  ", rel, "byte-identical:", same)
same_table = open(f"{a_dir}/table.md").read() == open(f"{b_dir}/table.md").read()
print("  table.md identical:", same_table)
sys.exit(0 if same_rows and same_logs and same_table else 1)
PY
status=0
for name in rnn transformer; do
  flags="$common ${sweeps[$name]}"
  echo "== $name: python -m experiments.ablation $flags"
  (cd "$tmp/src" && "$py" -m experiments.ablation $flags --workdir="$tmp/before_$name" > "$tmp/before_$name.log" 2>&1) \
    || { echo "before ($before_commit) failed:"; tail -5 "$tmp/before_$name.log"; exit 2; }
  "$py" -m experiments.ablation $flags --workdir="$tmp/after_$name" > "$tmp/after_$name.log" 2>&1 \
    || { echo "after (working tree) failed:"; tail -5 "$tmp/after_$name.log"; exit 2; }
  echo " before ($before_commit) vs after (the working tree), each from scratch:"
  "$py" "$tmp/compare.py" "$tmp/before_$name" "$tmp/after_$name" verbose || status=1
  (cd "$tmp/src" && "$py" -m experiments.ablation $flags --steps=20 --workdir="$tmp/resumed_$name" \
     > "$tmp/resumed_before_$name.log" 2>&1) \
    || { echo "before ($before_commit), 20 steps, failed:"; tail -5 "$tmp/resumed_before_$name.log"; exit 2; }
  "$py" -m experiments.ablation $flags --workdir="$tmp/resumed_$name" > "$tmp/resumed_after_$name.log" 2>&1 \
    || { echo "after (working tree), resuming, failed:"; tail -5 "$tmp/resumed_after_$name.log"; exit 2; }
  extended=$(grep -c "extended from 20 to 40 steps" "$tmp/resumed_after_$name.log" || true)
  echo " a workdir of $before_commit (20 steps) extended to 40 by the working tree ($extended runs" \
       "extended), vs the working tree from scratch:"
  [ "$extended" -gt 0 ] || status=1
  "$py" "$tmp/compare.py" "$tmp/after_$name" "$tmp/resumed_$name" || status=1
done
echo "all identical: $([ $status = 0 ] && echo yes || echo NO)"
exit $status
