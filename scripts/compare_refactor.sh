#!/usr/bin/env bash
# Same outputs on the same seeds before and after a refactor:
#   scripts/compare_refactor.sh 64f6691   # from the repository root
# (its output for the refactor of commit db6c306: results/archive/refactor_check/)
# Runs a small smoke sweep (3 arms, a=8, 2 seeds, 40 steps) with the code of
# commit $1 (a temporary git worktree) and with the working tree, then compares
# results.jsonl (every field but train_seconds and provenance) and table.md.
set -euo pipefail
before_commit=$1
py=${PYTHON:-.venv/bin/python}
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # absolute, not resolved (a venv's python is a link)
root=$(pwd)
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/src" "$before_commit"
flags="--preset=smoke --arms=additive,multiplicative,scaled_multiplicative --dims=8 --steps=40 --eval_every=20 --checkpoint_every=20 --diag_every=20"
(cd "$tmp/src" && "$py" -m experiments.ablation $flags --workdir="$tmp/before" > "$tmp/before.log" 2>&1)
"$py" -m experiments.ablation $flags --workdir="$tmp/after" > "$tmp/after.log" 2>&1
"$py" - "$tmp/before" "$tmp/after" <<'PY'
import json, sys
def rows(w):
  out = {}
  for line in open(f"{w}/results.jsonl"):
    r = json.loads(line); r.pop("train_seconds", None); r.pop("provenance", None)
    out[(r["arm"], r["dim"], r["seed"])] = r
  return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print("rows", len(a), len(b), "identical (all fields but train_seconds, provenance):", a == b)
for k in sorted(a):
  print(k, "test_bleu", a[k]["test_bleu"], b[k]["test_bleu"], "val_ppl", a[k]["val_ppl"],
        b[k]["val_ppl"], "logit_std", a[k]["diagnostics"]["logit_std"],
        b[k]["diagnostics"]["logit_std"])
same = open(f"{sys.argv[1]}/table.md").read() == open(f"{sys.argv[2]}/table.md").read()
print("table.md identical:", same)
PY
