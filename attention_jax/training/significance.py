"""Is an arm's BLEU different from the baseline's? Paired tests over test sentences.

The test is sacrebleu's paired approximate randomisation (Riezler & Maxwell
2005; sacrebleu's default paired test): for each trial every test sentence's
pair of hypotheses is swapped between the two systems with probability 1/2
and the corpus-BLEU difference recomputed; p is the share of trials whose
|difference| exceeds the observed one (with sacrebleu's +1 correction).

Why over sentences and not over seeds: the quick ablation has 2 seeds per
arm, and a test over 2 values per arm has almost no power; the sentence-level
test asks whether the observed difference could come from which sentences
happen to be in the test set. Seed-to-seed spread is reported separately
(the ± std of the table). Each seed of an arm is paired with the baseline's
run of the *same* seed (same data order); the reported p is the largest over
the seed pairs, so "p < 0.05" means every seed pair is significant. A small
largest p does not say the pairs agree on the direction: two pairs can each
differ significantly, in opposite directions (measured: scaled_multiplicative
against additive at a = 1024, lr 1e-3, −3.6 and +1.8 BLEU, both p < 0.001).
So the per-pair differences are kept too (`deltas`), and `signs_agree` says
whether no two pairs differ in opposite directions.

A zero difference is never significant: sacrebleu counts the trials whose
difference is strictly greater than the observed one (then +1), so where every
shuffled corpus scores the same as the observed pair (two identical outputs,
or two different outputs whose sentence statistics add up to the same corpus
counts, e.g. the same hypotheses in another order, or two outputs that both
score 0) it returns its minimum p = 1/(trials + 1) and a table would read
"+0.00 (p < 0.001)". `paired_test` returns p = 1 wherever the two corpus BLEU
scores are equal.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

# Trials per test: sacrebleu's default for approximate randomisation.
TRIALS = 10_000
# The version of `compare_runs`'s result; a cached result of another version is
# recomputed (`reports.significance`). 1: before `deltas` and `signs_agree`;
# 2: before a zero difference got p = 1.
FORMAT = 3


def paired_test(baseline: Sequence[str], system: Sequence[str],
                references: Sequence[str], trials: int = TRIALS) -> dict[str, float]:
  """BLEU of both systems, their difference and the AR p-value.

  Args:
    baseline, system: detokenised hypotheses, one per reference.
    references: detokenised references.
    trials: approximate-randomisation trials.

  Returns:
    dict with `baseline`, `system` (corpus BLEU), `delta` (= system − baseline)
    and `p`.
  """
  if not len(baseline) == len(system) == len(references) or not references:
    raise ValueError(
        f"`baseline`, `system` and `references` must hold the same positive number of "
        f"lines, got {len(baseline)}, {len(system)} and {len(references)}.")
  if trials < 1:
    raise ValueError(f"`trials` must be >= 1, got {trials}.")
  _, results = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                          {"BLEU": BLEU()}, [list(references)], test_type="ar",
                          n_samples=trials)()
  base, other = results["BLEU"]
  p = 1.0 if other.score == base.score else float(other.p_value)
  return {"baseline": float(base.score), "system": float(other.score),
          "delta": float(other.score - base.score), "p": p}


def compare_runs(baseline: dict, system: dict, trials: int = TRIALS) -> dict[str, float]:
  """Seed-paired tests of two runs' stored test translations.

  Args:
    baseline, system: `{"references": [N], "hypotheses": [E][N]}` as the
      trainer stores them, with the same references and seed order.

  Returns:
    dict with `delta` (mean over seed pairs of the BLEU difference),
    `deltas` (the differences, one per pair), `signs_agree` (no pair's
    difference has the sign opposite to another's; a zero difference agrees
    with either), `p_max` (largest p over the pairs) and `p` (the list, one per
    pair); pairs with a diverged member are left out, and with none left
    `delta`, `signs_agree` and `p_max` are None.
  """
  if list(baseline["references"]) != list(system["references"]):
    raise ValueError("the two runs were scored on different references.")
  pairs = list(zip(baseline["hypotheses"], system["hypotheses"]))
  if not pairs:
    raise ValueError("no seed pairs to compare.")
  # A diverged member has no translations (None): its pair is left out.
  pairs = [(b, s) for b, s in pairs if b is not None and s is not None]
  if not pairs:
    return {"delta": None, "deltas": [], "signs_agree": None, "p_max": None, "p": []}
  tests = [paired_test(b, s, baseline["references"], trials) for b, s in pairs]
  deltas = [t["delta"] for t in tests]
  return {"delta": float(np.mean(deltas)), "deltas": deltas,
          "signs_agree": not (min(deltas) < 0 < max(deltas)),
          "p_max": max(t["p"] for t in tests), "p": [t["p"] for t in tests]}
