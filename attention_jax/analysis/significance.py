"""Is an arm's BLEU different from the baseline's? Paired tests over test sentences.

The test is paired approximate randomisation (Riezler & Maxwell 2005; the
paired test sacrebleu uses by default): for each trial every test sentence's
pair of hypotheses is swapped between the two systems with probability 1/2
and the corpus-BLEU difference recomputed from the sentences' n-gram counts
(sacrebleu's BLEU, its defaults). p is the share of trials whose |difference|
is at least the observed one, ties included, with the +1 correction:
p = (count + 1) / (trials + 1).

Why ties count, and why not sacrebleu's `PairedTest`: sacrebleu counts only
the trials *strictly above* the observed difference. Where few sentences
differ, most trials reproduce the observed corpus, or the same corpus with
the two systems' roles exchanged, and so reproduce |difference| exactly.
With one of 32 test sentences different every trial does, the strict count
finds none, and sacrebleu returns its floor 1/(trials + 1): a table read
"-0.00 (p < 0.001)" for outputs that differ in one sentence. Under the null
hypothesis (the two systems are exchangeable) a trial as extreme as the
observed one is at least as extreme, so it counts; that p is then 1 there.
The same definition gives p = 1 to every zero difference (identical outputs,
outputs whose sentence counts add up to the same corpus counts, two outputs
both scoring 0), which the strict count also put at its floor.

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
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU

# Trials per test: sacrebleu's default for approximate randomisation.
TRIALS = 10_000
# The shuffles' seed (sacrebleu's default), so that a test repeats its p.
SEED = 12345
# Two BLEU differences this close are the same: a trial whose summed counts
# differ from the observed ones but give the same BLEU can differ from it in
# the last bits of a float, and must still count as a tie.
TIE_TOLERANCE = 1e-9
# The version of `compare_runs`'s result; a cached result of another version is
# recomputed (`reports.significance`). 1: before `deltas` and `signs_agree`;
# 2: before a zero difference got p = 1; 3: sacrebleu's strict count (a
# near-tie got the floor p).
FORMAT = 4


def sentence_counts(hypotheses: Sequence[str], references: Sequence[str],
                    bleu: BLEU) -> np.ndarray:
  """BLEU's sufficient statistics per sentence, `[N, 2 + 2 * order]`:
  hypothesis length, reference length, matched n-grams (order 1..4) and
  hypothesis n-grams (1..4); corpus BLEU is a function of their sum."""
  rows = []
  for hyp, ref in zip(hypotheses, references):
    score = bleu.corpus_score([hyp], [[ref]])
    rows.append([score.sys_len, score.ref_len, *score.counts, *score.totals])
  return np.asarray(rows, np.int64)


def bleu_of_counts(counts: np.ndarray, bleu: BLEU) -> float:
  """Corpus BLEU of summed sentence statistics (`sentence_counts(...).sum(0)`)."""
  order = bleu.max_ngram_order
  return float(BLEU.compute_bleu(
      correct=[int(c) for c in counts[2:2 + order]],
      total=[int(t) for t in counts[2 + order:]],
      sys_len=int(counts[0]), ref_len=int(counts[1]),
      smooth_method=bleu.smooth_method, smooth_value=bleu.smooth_value,
      effective_order=bleu.effective_order, max_ngram_order=order).score)


def randomisation_p(observed: float, shuffled: np.ndarray) -> float:
  """Two-sided p of the approximate-randomisation test: the share of trials
  whose |statistic| is at least |observed| (within `TIE_TOLERANCE`: ties
  count), with the +1 correction that makes p never 0."""
  shuffled = np.abs(np.asarray(shuffled, np.float64))
  count = int(np.sum(shuffled >= abs(observed) - TIE_TOLERANCE))
  return (count + 1) / (shuffled.size + 1)


def _shuffled_differences(base: np.ndarray, other: np.ndarray, trials: int,
                          bleu: BLEU) -> np.ndarray:
  """|BLEU difference| of each trial's swapped corpora. Trials that swap
  only sentences whose counts are equal give the same corpus, so each
  distinct pair of summed counts is scored once."""
  swap = np.random.default_rng(SEED).integers(2, size=(trials, len(base)), dtype=bool)
  gap = other - base  # what a swapped sentence moves from one corpus to the other
  # The baseline's side of each trial; float64 products of counts this small
  # are exact, and take BLAS's matrix product.
  moved = np.rint(swap.astype(np.float64) @ gap.astype(np.float64)).astype(np.int64)
  first = base.sum(0) + moved
  total = base.sum(0) + other.sum(0)
  distinct, index = np.unique(first, axis=0, return_inverse=True)
  scores = np.array([bleu_of_counts(c, bleu) - bleu_of_counts(total - c, bleu)
                     for c in distinct])
  return np.abs(scores[index.reshape(-1)])


def paired_test(baseline: Sequence[str], system: Sequence[str],
                references: Sequence[str], trials: int = TRIALS) -> dict[str, float]:
  """BLEU of both systems, their difference and the AR p-value.

  Args:
    baseline, system: detokenised hypotheses, one per reference.
    references: detokenised references.
    trials: approximate-randomisation trials.

  Returns:
    dict with `baseline`, `system` (corpus BLEU, as sacrebleu's
    `corpus_score` gives it), `delta` (= system − baseline) and `p`
    (`randomisation_p`: ties with the observed difference count).
  """
  if not len(baseline) == len(system) == len(references) or not references:
    raise ValueError(
        f"`baseline`, `system` and `references` must hold the same positive number of "
        f"lines, got {len(baseline)}, {len(system)} and {len(references)}.")
  if trials < 1:
    raise ValueError(f"`trials` must be >= 1, got {trials}.")
  bleu = BLEU()
  base = sentence_counts(baseline, references, bleu)
  other = sentence_counts(system, references, bleu)
  base_bleu, other_bleu = bleu_of_counts(base.sum(0), bleu), bleu_of_counts(other.sum(0), bleu)
  delta = other_bleu - base_bleu
  p = randomisation_p(delta, _shuffled_differences(base, other, trials, bleu))
  return {"baseline": base_bleu, "system": other_bleu, "delta": delta, "p": p}


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
