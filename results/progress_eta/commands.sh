#!/bin/sh
# The two measured commands, one after the other (never together: each is the
# other's load), every line of their output prefixed with the wall clock it
# was printed at (seconds since the epoch). From the repository root, with the
# venv active; WORK is any scratch folder.
set -e
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
python -u -m experiments.ablation --preset=transformer_smoke --workdir="$WORK/eta_tsmoke" 2>&1 \
  | stamp > results/progress_eta/transformer_smoke.log
python -u -m experiments.ablation --preset=smoke --workdir="$WORK/eta_smoke" 2>&1 \
  | stamp > results/progress_eta/smoke.log
# The workdir's path in the two logs was then replaced by <workdir>, and the
# repository's by nothing (results/ names no folder of the machine).
