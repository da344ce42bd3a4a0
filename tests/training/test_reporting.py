import os

import numpy as np

from attention_jax.training import reporting


def _rows():
  rows = []
  for arm, vals in (("additive", (20.0, 22.0)), ("multiplicative", (10.0, 12.0, 14.0))):
    for seed, v in enumerate(vals):
      rows.append({"arm": arm, "dim": 128, "seed": seed, "test_bleu": v,
                   "params": 1_500_000 if arm == "additive" else 1_400_000})
  return rows


def test_britz_table_mean_std_max():
  table = reporting.britz_table(_rows(), ["additive", "multiplicative"], [128, 1024])
  lines = table.strip().splitlines()
  assert lines[0] == "| dim | additive | multiplicative | params |"
  # additive: mean 21, sample std sqrt(2) = 1.41, max 22; multiplicative: 12 ± 2 (14)
  assert "| 128 | 21.00 ± 1.41 (22.00) | 12.00 ± 2.00 (14.00) | 1.400M / 1.500M |" in lines
  assert lines[-1].startswith("| 1024 | – | – |")


def test_perplexity_table_brackets_the_minimum_and_omits_params():
  rows = [{"arm": "additive", "dim": 8, "seed": s, "val_ppl": v, "params": 10}
          for s, v in enumerate((4.0, 6.0))]
  table = reporting.britz_table(rows, ["additive"], [8], metric="val_ppl", best=min,
                                params=False)
  assert table.splitlines()[0] == "| dim | additive |"
  assert "| 8 | 5.00 ± 1.41 (4.00) |" in table


def test_significance_table():
  tests = {("multiplicative", 128): {"delta": -3.456, "p_max": 0.0001, "p": [0.0001]},
           ("multiplicative", 1024): {"delta": 0.5, "p_max": 0.25, "p": [0.1, 0.25]}}
  table = reporting.significance_table(tests, ["additive", "multiplicative"], [128, 1024, 2048],
                                       "additive")
  lines = table.splitlines()
  assert lines[0] == "| dim | multiplicative − additive |"
  assert "| 128 | -3.46 (p < 0.001) |" in lines
  assert "| 1024 | +0.50 (p = 0.250) |" in lines
  assert "| 2048 | – |" in lines
  tests[("multiplicative", 2048)] = {"delta": -0.91, "deltas": [-3.6, 1.78], "signs_agree": False,
                                     "p_max": 0.0002, "p": [0.0001, 0.0002]}
  lines = reporting.significance_table(tests, ["additive", "multiplicative"], [2048],
                                       "additive").splitlines()
  assert lines[2] == "| 2048 | -0.91 (p < 0.001; seed pairs disagree: -3.60, +1.78) |"


def test_plots_are_written(tmp_path):
  rows = _rows()
  reporting.plot_ablation(rows, ["additive", "multiplicative"], str(tmp_path / "a.png"))
  hist = {("additive", 128): [{"step": s, "seed": 0, "logit_std": 1.0 + s, "entropy": 0.5}
                              for s in (10, 20)]}
  reporting.plot_diagnostics(hist, ["additive"], str(tmp_path / "d.png"))
  reporting.plot_validation({("additive", 128): [{"step": s, "seed": 0, "val_bleu": s / 2,
                                                  "val_ppl": 100 / s} for s in (10, 20)]},
                            ["additive"], str(tmp_path / "v.png"))
  reporting.plot_attention({"src": ["a", "b", "</s>"], "hyp": ["x", "</s>"],
                            "weights": np.full((2, 3), 1 / 3)}, "t", str(tmp_path / "h.png"))
  for name in ("a.png", "d.png", "v.png", "h.png"):
    with open(tmp_path / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_write_jsonl_roundtrip(tmp_path):
  import json
  path = str(tmp_path / "r.jsonl")
  reporting.write_jsonl(path, _rows())
  with open(path) as f:
    back = [json.loads(line) for line in f]
  assert back == [dict(sorted(r.items())) for r in _rows()]
