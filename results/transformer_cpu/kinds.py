"""Which attention kind's logits grow first, and when, in the d_k ablation.

    python results/transformer_cpu/kinds.py WORKDIR [LAST_STEP] > results/transformer_cpu/kinds.md

Reads every run's `metrics.jsonl` in WORKDIR (`experiments.ablation
--preset=transformer`) and prints markdown tables, per arm and d_k, of the
softmax diagnostics of each attention kind (`encoder_self`, `decoder_self`,
`cross`; the largest over the layers of a kind): the largest logit and the
share of saturated rows (largest weight > 0.99) at the first diagnostics step
and at the last, as the mean over seeds, and the first step at which a kind
has half its rows saturated. With LAST_STEP, steps after it are left out (the
tables of a run before an extension). The step-0 values of the same models are in
results/init_logits (`experiments.init_logits`), which trains nothing.
"""

import collections
import glob
import json
import os
import sys

KINDS = ("encoder_self", "decoder_self", "cross")
ARMS = ("dot", "scaled_dot", "inverse_dim", "qk_norm", "additive")  # the preset's order
HALF = 0.5  # share of saturated rows that counts as "the softmax has saturated"


def _kind_value(row: dict, name: str, kind: str) -> float:
  """The largest `name_<kind>_l<i>` over the layers of `kind` in one metrics row."""
  values = [v for k, v in row.items() if k.startswith(f"{name}_{kind}_l") and v is not None]
  return max(values) if values else float("nan")


def _runs(workdir: str, last_step: float = float("inf")):
  """{(arm, d_k): {step: [diagnostics rows, one per seed]}} of every run, up to `last_step`."""
  out = {}
  for path in sorted(glob.glob(os.path.join(workdir, "runs", "*_d*", "metrics.jsonl"))):
    arm, dim = os.path.basename(os.path.dirname(path)).rsplit("_d", 1)
    by_step = collections.defaultdict(list)
    for line in open(path, encoding="utf-8"):
      row = json.loads(line)
      if "max_logit" in row and row["step"] <= last_step:  # diagnostics (not validation) rows
        by_step[row["step"]].append(row)
    out[(arm, int(dim))] = dict(by_step)
  return out


def _mean(values):
  return sum(values) / len(values)


def _in_order(runs):
  """(arm, d_k, steps) of every run, by the preset's arm order, then d_k."""
  rank = {a: i for i, a in enumerate(ARMS)}
  for arm, dim in sorted(runs, key=lambda key: (rank.get(key[0], len(ARMS)), key)):
    yield arm, dim, runs[(arm, dim)]


def main(workdir: str, last_step: float = float("inf")) -> None:
  runs = _runs(workdir, last_step)
  if not runs:
    sys.exit(f"error: no runs/*/metrics.jsonl under {workdir}")
  first = min(min(s) for s in runs.values())
  print(f"Largest attention logit per kind (the largest over its layers; mean over seeds) "
        f"at step {first} and at the last step; in brackets the share of saturated rows "
        f"(largest weight > 0.99) at the last step.\n")
  print("| arm | d_k | last step | " + " | ".join(KINDS) + " |")
  print("|---|---|---|" + "---|" * len(KINDS))
  for arm, dim, steps in _in_order(runs):
    last = max(steps)
    cells = []
    for kind in KINDS:
      early = _mean([_kind_value(r, "max_logit", kind) for r in steps[first]])
      end = _mean([_kind_value(r, "max_logit", kind) for r in steps[last]])
      sat = _mean([_kind_value(r, "saturated", kind) for r in steps[last]])
      cells.append(f"{early:.1f} → {end:.1f} ({100 * sat:.0f}%)")
    print(f"| `{arm}` | {dim} | {last} | " + " | ".join(cells) + " |")
  print(f"\nFirst diagnostics step at which a kind has ≥ {HALF:.0%} of its rows saturated in "
        "some layer (every seed), or – if never.\n")
  print("| arm | d_k | " + " | ".join(KINDS) + " |")
  print("|---|---|" + "---|" * len(KINDS))
  for arm, dim, steps in _in_order(runs):
    cells = []
    for kind in KINDS:
      hit = [s for s in sorted(steps)
             if all(_kind_value(r, "saturated", kind) >= HALF for r in steps[s])]
      cells.append(str(hit[0]) if hit else "–")
    print(f"| `{arm}` | {dim} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  if len(sys.argv) not in (2, 3):
    sys.exit("usage: python results/transformer_cpu/kinds.py WORKDIR [LAST_STEP]")
  main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
