"""Adds the `provenance` of every row to the d_k ablation's results.jsonl, after the run.

    PYTHONPATH=. .venv/bin/python results/transformer_cpu/stamp_provenance.py \
        results/transformer_cpu/steps1500/results.jsonl 1500

The ablation runs with the frozen code of commit 9d5d280 (first segment:
763c350), which wrote no provenance into its rows; this writes what that code
would have written (`attention_jax.training.provenance.record`): the commits
that trained the row's run, the library versions of the environment it ran in
(the same `.venv`, read now), the platform and CPU model, the command and the
XLA flags of its `--workers` processes. `stamped_after_the_run` says the
fields were added afterwards, by this script.
"""

import json
import os
import sys

from attention_jax.training import provenance
from attention_jax.training import workers

# Segment 1 (commit 763c350) trained the first two runs to step 1000 before a
# session end; every later segment ran 9d5d280. Between the two commits only
# comments changed in the model, layer, step and score code
# (`git diff 763c350 9d5d280 -- attention_jax/models attention_jax/layers.py
# attention_jax/training/steps.py attention_jax/scores.py`).
FIRST_SEGMENT = {("dot", 1024), ("scaled_dot", 1024)}
COMMITS = ("763c350d6cddbca16fa787ffa0c19708e6fc5223",
           "9d5d2806c2eb6eace02e72614957e114b731bc31")


def main(path: str, steps: int) -> None:
  if not os.path.isfile(path):
    sys.exit(f"error: {path} is not a file")
  here = provenance.fields()
  command = "python -m experiments.ablation --preset=transformer --workdir=/work/runs_t/transformer"
  if steps != 1500:
    command += f" --steps={steps}"
  rows = [json.loads(line) for line in open(path, encoding="utf-8")]
  for row in rows:
    if row.get("steps") != steps:
      sys.exit(f"error: {path}: a row of {row.get('steps')} steps, not {steps}")
    first = (row["arm"], row["dim"]) in FIRST_SEGMENT
    row[provenance.KEY] = {
        **provenance.record(
            commit=COMMITS[1], dirty=False, versions=here["versions"],
            platform=here["platform"], device_kind=here["device_kind"], command=command,
            xla_flags=workers.ONE_THREAD_XLA_FLAGS),
        "commits": list(COMMITS) if first else [COMMITS[1]],
        "stamped_after_the_run": True}
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
  if len(sys.argv) != 3:
    sys.exit("usage: stamp_provenance.py RESULTS_JSONL STEPS")
  main(sys.argv[1], int(sys.argv[2]))
