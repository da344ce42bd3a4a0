"""Paired approximate randomisation between two systems' test translations."""

import random

import pytest

from attention_jax.analysis import tables, significance

_WORDS = "el de la que y a en los se del las un por con no una su para es al lo como".split()


def _systems(n=300, seed=0):
  rng = random.Random(seed)
  refs = [" ".join(rng.choice(_WORDS) for _ in range(20)) for _ in range(n)]

  def noisy(keep):  # keeps each reference word with probability `keep`
    return [" ".join(w if rng.random() < keep else rng.choice(_WORDS) for w in r.split())
            for r in refs]

  return refs, noisy


def test_known_difference_is_significant():
  refs, noisy = _systems()
  good, bad = noisy(0.8), noisy(0.4)
  out = significance.paired_test(good, bad, refs, trials=2000)
  assert out["delta"] == pytest.approx(out["system"] - out["baseline"])
  assert out["delta"] < -10
  assert out["p"] < 0.001


def test_identical_systems_are_not_different():
  refs, noisy = _systems()
  hyp = noisy(0.6)
  out = significance.paired_test(hyp, list(hyp), refs, trials=500)
  assert out["delta"] == 0.0 and out["p"] == 1.0


@pytest.mark.parametrize("case", ["other_wrong_words", "both_zero"])
def test_different_outputs_of_equal_bleu_are_not_significant(case):
  # Each sentence has the same n-gram counts in both outputs, so every shuffled
  # corpus scores as the observed pair does: every trial ties the zero
  # difference (sacrebleu's strict count found none above it: 1/(trials + 1)).
  refs, noisy = _systems(n=50)
  if case == "other_wrong_words":  # the same mistakes, spelt differently
    hyp = noisy(0.6)
    baseline, system = [h + " qqq" for h in hyp], [h + " zzz" for h in hyp]
  else:  # no word of either matches a reference
    baseline, system = ["qqq"] * 50, ["zzz"] * 50
  assert system != baseline
  out = significance.paired_test(baseline, system, refs, trials=200)
  assert out["delta"] == 0.0 and out["p"] == 1.0
  runs = [{"references": refs, "hypotheses": [h]} for h in (baseline, system)]
  table = tables.significance_table(
      {("multiplicative", 8): significance.compare_runs(*runs, trials=200)},
      ["additive", "multiplicative"], [8], "additive")
  assert "| 8 | +0.00 (p = 1.000) |" in table


def test_outputs_that_differ_in_one_sentence_of_32_are_not_significant():
  """Every trial either swaps the one differing sentence or not, so each
  reproduces the observed |difference|: all trials tie it and p = 1.
  sacrebleu's strict count found no trial above it and gave its floor,
  1/(trials + 1), which a table printed as "p < 0.001"."""
  refs, noisy = _systems(n=32, seed=5)
  baseline = noisy(0.6)
  system = list(baseline)
  system[7] = noisy(0.2)[7]
  assert sum(b != s for b, s in zip(baseline, system)) == 1
  out = significance.paired_test(baseline, system, refs, trials=500)
  assert 0 < abs(out["delta"]) < 3
  assert out["p"] == 1.0
  runs = [{"references": refs, "hypotheses": [h]} for h in (baseline, system)]
  table = tables.significance_table(
      {("multiplicative", 8): significance.compare_runs(*runs, trials=500)},
      ["additive", "multiplicative"], [8], "additive")
  assert f"| 8 | {out['delta']:+.2f} (p = 1.000) |" in table


def test_ties_with_the_observed_difference_count():
  # |-2| and |2| tie 2 (as does 2 within float noise), 3 exceeds it, 1 does not:
  # (4 + 1) / (5 + 1)
  assert significance.randomisation_p(-2.0, [2.0, -2.0, 1.0, 3.0, 2.0 - 1e-12]) == 5 / 6
  assert significance.randomisation_p(0.0, [0.0] * 9) == 1.0
  assert significance.randomisation_p(5.0, [1.0] * 9) == 1 / 10


def test_without_ties_the_p_value_is_sacrebleus():
  """Where no trial ties the observed difference, counting ties changes
  nothing: the same shuffles (same seed) give sacrebleu's p and BLEU."""
  from sacrebleu.metrics import BLEU
  from sacrebleu.significance import PairedTest
  refs, noisy = _systems(n=100, seed=4)
  baseline, system = noisy(0.6), noisy(0.6)
  _, results = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU()},
                          [refs], test_type="ar", n_samples=1000)()
  out = significance.paired_test(baseline, system, refs, trials=1000)
  assert 0.01 < out["p"] < 0.99
  assert out["p"] == results["BLEU"][1].p_value
  assert (out["baseline"], out["system"]) == (results["BLEU"][0].score,
                                              results["BLEU"][1].score)


def test_two_draws_of_the_same_quality_are_not_significant():
  refs, noisy = _systems(seed=3)
  out = significance.paired_test(noisy(0.6), noisy(0.6), refs, trials=2000)
  assert abs(out["delta"]) < 3
  assert out["p"] > 0.05


def test_compare_runs_pairs_seeds_and_reports_the_largest_p():
  refs, noisy = _systems()
  base = {"references": refs, "hypotheses": [noisy(0.8), noisy(0.8)]}
  same = {"references": refs, "hypotheses": [base["hypotheses"][0], noisy(0.4)]}
  out = significance.compare_runs(base, same, trials=500)
  assert out["p"][0] == 1.0 and out["p"][1] < 0.01  # seed 0 identical, seed 1 worse
  assert out["p_max"] == 1.0
  assert out["delta"] < -5
  assert out["deltas"][0] == 0.0 and out["deltas"][1] < -10
  assert out["delta"] == pytest.approx(sum(out["deltas"]) / 2)
  assert out["signs_agree"]  # a zero difference sides with either sign


def test_compare_runs_flags_seed_pairs_that_differ_in_opposite_directions():
  refs, noisy = _systems()
  base = {"references": refs, "hypotheses": [noisy(0.8), noisy(0.4)]}
  other = {"references": refs, "hypotheses": [noisy(0.4), noisy(0.8)]}
  out = significance.compare_runs(base, other, trials=500)
  assert out["deltas"][0] < -10 < 10 < out["deltas"][1]
  assert out["p_max"] < 0.01  # each pair is significant on its own ...
  assert not out["signs_agree"]  # ... but not in the same direction


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="same positive number"):
    significance.paired_test(["a"], ["a", "b"], ["a"])
  with pytest.raises(ValueError, match="different references"):
    significance.compare_runs({"references": ["a"], "hypotheses": [["a"]]},
                              {"references": ["b"], "hypotheses": [["a"]]})


def test_the_sweep_caches_each_comparison_under_its_inputs_and_format(tmp_path):
  """`reports.significance` reuses a cached result only for the same two runs'
  translations and the same result format; anything else is recomputed."""
  import json
  import os
  from attention_jax.analysis import reports
  from attention_jax.sweep import config, workdir as workdir_lib
  refs, noisy = _systems(n=60)
  runs = {"additive": [noisy(0.8), noisy(0.8)], "multiplicative": [noisy(0.4), noisy(0.4)]}
  workdir = workdir_lib.Workdir(str(tmp_path))
  for arm, hyps in runs.items():
    folder = workdir.run(config.Arm.of(arm, 8))
    os.makedirs(folder.path)
    with open(folder.translations, "w") as f:
      json.dump({"references": refs, "hypotheses": hyps}, f)
  cfg = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8,))
  multiplicative = config.Arm.of("multiplicative", 8)
  cache = workdir.run(multiplicative).significance
  assert cache == os.path.join(str(tmp_path), "runs", "multiplicative_d8", "significance.json")

  first = reports.significance(workdir, cfg)[multiplicative]
  assert first["delta"] < -10 and len(first["deltas"]) == 2
  with open(cache) as f:
    stored = json.load(f)
  assert stored["format"] == significance.FORMAT and stored["result"] == first

  marked = {**stored, "result": {**first, "delta": 123.0}}  # a cache hit returns it as is
  with open(cache, "w") as f:
    json.dump(marked, f)
  assert reports.significance(workdir, cfg)[multiplicative]["delta"] == 123.0
  for stale in ({**marked, "format": significance.FORMAT - 1},   # an older result format
                {**marked, "digest": "0" * 64}):                  # other translations
    with open(cache, "w") as f:
      json.dump(stale, f)
    assert reports.significance(workdir, cfg)[multiplicative] == first


def test_another_baseline_is_compared_afresh_never_read_from_the_cache(tmp_path):
  """Why `baseline` changes no number of a run: it only chooses what the
  paired tests compare, and a run's cached test (significance.json) is of the
  two runs' translations, so a test against another baseline is computed."""
  import json
  import os
  from attention_jax.analysis import reports
  from attention_jax.sweep import config, workdir as workdir_lib
  refs, noisy = _systems(n=60)
  runs = {"additive": [noisy(0.8)], "multiplicative": [noisy(0.4)],
          "scaled_multiplicative": [noisy(0.6)]}
  workdir = workdir_lib.Workdir(str(tmp_path))
  for arm, hyps in runs.items():
    folder = workdir.run(config.Arm.of(arm, 8))
    os.makedirs(folder.path)
    with open(folder.translations, "w") as f:
      json.dump({"references": refs, "hypotheses": hyps}, f)
  cfg = config.from_preset("smoke", arms=tuple(runs), dims=(8,), seeds=1)
  scaled = config.Arm.of("scaled_multiplicative", 8)
  # each direct comparison once (each costs the same ~0.5 s of bootstrap trials)
  want = {base: significance.compare_runs({"references": refs, "hypotheses": runs[base]},
                                           {"references": refs,
                                            "hypotheses": runs[scaled.name]})
          for base in ("additive", "multiplicative")}
  assert want["additive"] != want["multiplicative"]  # so that a cached answer would show
  for base in ("additive", "multiplicative", "additive"):
    got = reports.significance(workdir, cfg.replace(baseline=base))[scaled]
    assert got == want[base]
    with open(workdir.run(scaled).significance) as f:
      assert json.load(f)["baseline"] == base

