import os

import numpy as np
import pytest

from attention_jax.analysis import tables

from attention_jax.analysis import plots

from attention_jax import files


def _rows():
  rows = []
  for arm, vals in (("additive", (20.0, 22.0)), ("multiplicative", (10.0, 12.0, 14.0))):
    for seed, v in enumerate(vals):
      rows.append({"arm": arm, "dim": 128, "seed": seed, "test_bleu": v,
                   "params": 1_500_000 if arm == "additive" else 1_400_000})
  return rows


def test_britz_table_mean_std_max():
  table = tables.britz_table(_rows(), ["additive", "multiplicative"], [128, 1024])
  lines = table.strip().splitlines()
  assert lines[0] == "| dim | additive | multiplicative | params |"
  # additive: mean 21, sample std sqrt(2) = 1.41, max 22; multiplicative: 12 ± 2 (14)
  assert "| 128 | 21.00 ± 1.41 (22.00) | 12.00 ± 2.00 (14.00) | 1.400M / 1.500M |" in lines
  assert lines[-1].startswith("| 1024 | – | – |")


def test_perplexity_table_brackets_the_minimum_and_omits_params():
  rows = [{"arm": "additive", "dim": 8, "seed": s, "val_ppl": v, "params": 10}
          for s, v in enumerate((4.0, 6.0))]
  table = tables.britz_table(rows, ["additive"], [8], metric="val_ppl", best=min,
                                params=False)
  assert table.splitlines()[0] == "| dim | additive |"
  assert "| 8 | 5.00 ± 1.41 (4.00) |" in table


def test_significance_table():
  tests = {("multiplicative", 128): {"delta": -3.456, "p_max": 0.0001, "p": [0.0001]},
           ("multiplicative", 1024): {"delta": 0.5, "p_max": 0.25, "p": [0.1, 0.25]}}
  table = tables.significance_table(tests, ["additive", "multiplicative"], [128, 1024, 2048],
                                       "additive")
  lines = table.splitlines()
  assert lines[0] == "| dim | multiplicative − additive |"
  assert "| 128 | -3.46 (p < 0.001) |" in lines
  assert "| 1024 | +0.50 (p = 0.250) |" in lines
  assert "| 2048 | – |" in lines
  tests[("multiplicative", 2048)] = {"delta": -0.91, "deltas": [-3.6, 1.78], "signs_agree": False,
                                     "p_max": 0.0002, "p": [0.0001, 0.0002]}
  lines = tables.significance_table(tests, ["additive", "multiplicative"], [2048],
                                       "additive").splitlines()
  assert lines[2] == "| 2048 | -0.91 (p < 0.001; seed pairs disagree: -3.60, +1.78) |"


def test_plots_are_written(tmp_path):
  rows = _rows()
  plots.plot_ablation(rows, ["additive", "multiplicative"], str(tmp_path / "a.png"))
  hist = {("additive", 128): [{"step": s, "seed": 0, "logit_std": 1.0 + s, "entropy": 0.5}
                              for s in (10, 20)]}
  plots.plot_diagnostics(hist, ["additive"], str(tmp_path / "d.png"))
  plots.plot_validation({("additive", 128): [{"step": s, "seed": 0, "val_bleu": s / 2,
                                                  "val_ppl": 100 / s} for s in (10, 20)]},
                            ["additive"], str(tmp_path / "v.png"))
  plots.plot_attention({"src": ["a", "b", "</s>"], "hyp": ["x", "</s>"],
                            "weights": np.full((2, 3), 1 / 3)}, "t", str(tmp_path / "h.png"))
  for name in ("a.png", "d.png", "v.png", "h.png"):
    with open(tmp_path / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_an_empty_hypothesis_draws_the_source_with_a_note_and_no_warning(tmp_path,
                                                                        monkeypatch):
  # A first run's heat map was blank (`"hyp": []`), with a matplotlib
  # warning naming a path of this machine, three to five times per run.
  import warnings
  drawn = []
  save = plots.save_figure
  monkeypatch.setattr(plots, "save_figure", lambda fig, path: (drawn.append(fig),
                                                               save(fig, path)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    plots.plot_attention({"src": ["a", "b", "</s>"], "hyp": [],
                          "weights": np.full((1, 3), 1 / 3)}, "t", str(tmp_path / "h.png"))
  assert [str(w.message) for w in caught] == []
  (ax,) = drawn[0].axes
  assert not ax.images  # no heat map of no rows
  assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "</s>"]
  assert [t.get_text() for t in ax.texts] == [plots.EMPTY_HYPOTHESIS_NOTE]
  assert "empty" in plots.EMPTY_HYPOTHESIS_NOTE
  assert _read_png(tmp_path / "h.png") == b"\x89PNG\r\n\x1a\n"


def test_write_jsonl_roundtrip(tmp_path):
  import json
  path = str(tmp_path / "r.jsonl")
  files.write_jsonl(path, _rows())
  with open(path) as f:
    back = [json.loads(line) for line in f]
  assert back == [dict(sorted(r.items())) for r in _rows()]


# -- the Transformer's diagnostics per attention kind and layer ---------------

def _kind_diagnostics(peak: float, saturated: float = 0.9, entropy: float = 0.01) -> dict:
  """End-of-training diagnostics of a two-layer Transformer: the decoder's
  first self attention has the largest logit (`peak`), the encoder's
  second layer its own largest, the cross attention stays small; the global
  `max_logit` is the cross attention's, as the model reports it."""
  d = {"max_logit": 14.0, "saturated": 0.01, "entropy": 0.7, "logit_std": 1.0}
  for kind, logits, sat, ent in (
      ("encoder_self", (40.0, 200.0), (0.2, 0.6), (0.3, 0.05)),
      ("decoder_self", (peak, 80.0), (saturated, 0.5), (entropy, 0.2)),
      ("cross", (14.0, 12.0), (0.0, 0.01), (0.74, 0.71))):
    for layer in range(2):
      d[f"max_logit_{kind}_l{layer}"] = logits[layer]
      d[f"saturated_{kind}_l{layer}"] = sat[layer]
      d[f"entropy_{kind}_l{layer}"] = ent[layer]
      d[f"logit_std_{kind}_l{layer}"] = 5.0
  return d


def _transformer_rows():
  rows = []
  for arm, peaks in (("dot", (300.0, 400.0)), ("scaled_dot", (9.0, 11.0))):
    for seed, peak in enumerate(peaks):
      rows.append({"arm": arm, "dim": 16, "seed": seed, "test_bleu": 5.0 + seed, "params": 1000,
                   "val_ppl": 30.0, "diagnostics": _kind_diagnostics(peak)})
  rows.append({"arm": "scaled_dot", "dim": 16, "seed": 2, "test_bleu": None, "params": 1000,
               "diverged_at_step": 40, "diagnostics": _kind_diagnostics(1e6)})
  return rows


def test_the_kinds_are_the_models():
  from attention_jax.models.transformer import ATTENTION_KINDS
  assert set(tables.KINDS) == set(ATTENTION_KINDS.values())


def test_a_kind_is_its_layer_furthest_towards_saturation():
  d = _kind_diagnostics(300.0)
  assert tables.layer_values(d, "max_logit", "decoder_self") == {0: 300.0, 1: 80.0}
  assert tables.kind_value(d, "max_logit", "encoder_self") == 200.0  # its second layer
  assert tables.kind_value(d, "saturated", "decoder_self") == 0.9  # the largest share
  assert tables.kind_value(d, "entropy", "encoder_self") == 0.05  # the lowest entropy
  assert tables.kind_value({**d, "max_logit_cross_l1": None}, "max_logit", "cross") == 14.0
  assert tables.kind_value(_rows()[0], "max_logit", "cross") is None  # the RNN: none
  assert not tables.has_kinds(_rows()) and tables.has_kinds(_transformer_rows())
  # a metrics-log row has them as its own fields
  assert tables.with_kind_values({"step": 5, **d})["max_logit_decoder_self"] == 300.0


def test_kind_table_means_each_kinds_summary_over_seeds():
  table = tables.kind_table(_transformer_rows(), ["dot", "scaled_dot"], [16, 128],
                               "max_logit").splitlines()
  assert table[0] == "| arm | dim | encoder_self | decoder_self | cross |"
  # dot: decoder self (300 + 400) / 2; the encoder's second layer; the cross attention's first
  assert table[2] == "| dot | 16 | 200.0 | 350.0 | 14.0 |"
  # scaled_dot's diverged seed (1e6) counts in no mean and is named
  assert table[3] == "| scaled_dot (1 of 3 seeds diverged) | 16 | 200.0 | 80.0 | 14.0 |"
  assert len(table) == 4  # no row for d = 128, which has no runs
  saturated = tables.kind_table(_transformer_rows(), ["dot"], [16], "saturated")
  assert "| dot | 16 | 60% | 90% | 1% |" in saturated
  entropy = tables.kind_table(_transformer_rows(), ["dot"], [16], "entropy")
  assert "| dot | 16 | 0.050 | 0.010 | 0.710 |" in entropy


def test_kind_table_per_layer_has_a_column_per_kind_and_layer():
  rows = [{**r, "diagnostics": {**r["diagnostics"], "max_logit_decoder_self_l0": 25184.4}}
          for r in _transformer_rows() if r["arm"] == "dot"]
  lines = tables.kind_table(rows, ["dot"], [16], "max_logit", per_layer=True).splitlines()
  assert lines[0] == ("| arm | dim | encoder_self l0 | encoder_self l1 | decoder_self l0 | "
                      "decoder_self l1 | cross l0 | cross l1 |")
  assert lines[2] == "| dot | 16 | 40.0 | 200.0 | 25,184 | 80.0 | 14.0 | 12.0 |"


def _fake_workdir(path, model_rows, metrics_rows):
  """A workdir with finished runs: `model_rows[arm]` its result rows,
  `metrics_rows[arm]` its metrics log."""
  import json
  from attention_jax.sweep import config, workdir as workdir_lib
  workdir = workdir_lib.Workdir(str(path))
  for arm, rows in model_rows.items():
    run = workdir.run(config.Arm.of(arm, rows[0]["dim"]))
    os.makedirs(run.path)
    with open(run.result, "w") as f:
      json.dump(rows, f)
    with open(run.metrics, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in metrics_rows[arm])
  return workdir


def _history(rows):
  return [{"step": step, "seed": r["seed"], "loss": 3.0, "val_bleu": 1.0, "val_ppl": 30.0,
           **{k: v * step / 200 for k, v in r["diagnostics"].items()}}
          for r in rows for step in (100, 200)]


def _by_arm(rows):
  out = {}
  for r in rows:
    out.setdefault(r["arm"], []).append(r)
  return out


def _read_png(path):
  with open(path, "rb") as f:
    return f.read(8)


def test_a_transformer_sweep_reports_every_kind_and_the_rnns_reports_do_not(tmp_path):
  from attention_jax.analysis import reports
  from attention_jax.sweep import config
  runs = _by_arm(_transformer_rows())
  workdir = _fake_workdir(tmp_path / "t", runs, {a: _history(r) for a, r in runs.items()})
  cfg = config.from_preset("transformer", arms=("dot", "scaled_dot"), dims=(16,))
  text = reports.write_reports(workdir, cfg)
  assert text.count("per attention kind (") == 3 and text.count("per attention kind and") == 3
  assert "| dot | 16 | 200.0 | 350.0 | 14.0 |" in text  # the largest logits, per kind
  assert "| dot | 16 | 40.0 | 200.0 | 350.0 | 80.0 | 14.0 | 12.0 |" in text  # per layer
  assert _read_png(workdir.kinds_plot) == b"\x89PNG\r\n\x1a\n"

  rnn = {"additive": [r for r in _rows() if r["arm"] == "additive"]}
  for r in rnn["additive"]:
    r.update(val_ppl=20.0, diagnostics={"max_logit": 12.0, "saturated": 0.1, "entropy": 0.5})
  plain = _fake_workdir(tmp_path / "r", rnn, {"additive": _history(rnn["additive"])})
  text = reports.write_reports(plain, config.from_preset("smoke", arms=("additive",),
                                                         dims=(128,)))
  assert "attention kind" not in text and text.count("\n|---|") == 2  # BLEU, perplexity
  assert not os.path.exists(plain.kinds_plot)
  assert _read_png(plain.diagnostics_plot) == b"\x89PNG\r\n\x1a\n"


def test_a_transformer_grid_reports_every_kind_and_an_rnn_grid_its_max_logit(tmp_path):
  from attention_jax.analysis import reports
  from attention_jax.sweep import config, workdir as workdir_lib
  for model, preset, arms, dim in (("transformer", "transformer", ("dot", "scaled_dot"), 16),
                                   ("rnn", "smoke", ("additive",), 128)):
    cfg = config.from_preset(preset, arms=arms, dims=(dim,))
    points = config.grid(cfg, (("learning_rate", (1e-3, 3e-3)),))
    workdir = workdir_lib.Workdir(str(tmp_path / model))
    for p, scale in zip(points, (1.0, 10.0)):  # the larger learning rate: 10x the logits
      rows = _transformer_rows() if model == "transformer" else [
          {**r, "diagnostics": {"max_logit": 12.0}} for r in _rows() if r["arm"] == "additive"]
      for r in rows:
        r["diagnostics"] = {k: v * scale if k.startswith("max_logit") else v
                            for k, v in r["diagnostics"].items()}
      by_arm = _by_arm(rows)
      _fake_workdir(workdir.point(p).path, by_arm, {a: _history(r) for a, r in by_arm.items()})
    text = reports.write_grid_reports(workdir, cfg, points)
    assert _read_png(workdir.max_logit_plot) == b"\x89PNG\r\n\x1a\n"
    cross_only = "## Largest attention logit at the end of training (validation batch; raw"
    if model == "transformer":
      assert cross_only not in text  # it was the cross attention's alone
      assert text.count("per attention kind (") == 3
      assert "| dot | 0.001 | 200.0 | 350.0 | 14.0 |" in text
      assert "| dot | 0.003 | 2,000 | 3,500 | 140.0 |" in text
      assert "| dot | 0.003 | 60% | 90% | 1% |" in text
      assert _read_png(workdir.kinds_plot) == b"\x89PNG\r\n\x1a\n"
    else:
      assert cross_only in text and "attention kind" not in text
      assert "| 0.003 | 120.00 ± 0.00 (120.00) |" in text
      assert not os.path.exists(workdir.kinds_plot)


def _one_layer_rows():
  """`_transformer_rows` of a one-layer Transformer: layer 0 of each kind only."""
  return [{**r, "diagnostics": {k: v for k, v in r["diagnostics"].items()
                                if not k.endswith("_l1")}} for r in _transformer_rows()]


def test_a_one_layer_model_has_no_per_layer_tables_repeating_its_per_kind_tables(tmp_path):
  # Each per-layer table of a one-layer model was its per-kind table again,
  # cell for cell, under another caption.
  from attention_jax.analysis import reports
  from attention_jax.sweep import config, workdir as workdir_lib
  runs = _by_arm(_one_layer_rows())
  workdir = _fake_workdir(tmp_path / "t", runs, {a: _history(r) for a, r in runs.items()})
  cfg = config.from_preset("transformer", arms=("dot", "scaled_dot"), dims=(16,))
  text = reports.write_reports(workdir, cfg)
  assert text.count("per attention kind (") == 3
  assert "per attention kind and layer" not in text and " l0 |" not in text
  assert text.count("| dot | 16 | 40.0 | 350.0 | 14.0 |") == 1  # the largest logits, once
  assert "Each attention kind has one layer here" in text
  # a grid of one-layer points: the same
  points = config.grid(cfg, (("learning_rate", (1e-3, 3e-3)),))
  grid = workdir_lib.Workdir(str(tmp_path / "g"))
  for p in points:
    _fake_workdir(grid.point(p).path, runs, {a: _history(r) for a, r in runs.items()})
  text = reports.write_grid_reports(grid, cfg, points)
  assert text.count("per attention kind (") == 3 and "per attention kind and layer" not in text
  assert "Each attention kind has one layer here" in text
  assert tables.one_layer_per_kind(_one_layer_rows())
  assert not tables.one_layer_per_kind(_transformer_rows())


@pytest.mark.parametrize("seeds,said", [(1, "1 seed."), (2, "2 seeds.")])
def test_the_table_says_seed_in_the_singular_for_one(tmp_path, seeds, said):
  from attention_jax.analysis import reports
  from attention_jax.sweep import config
  from attention_jax.sweep import workdir as workdir_lib
  text = reports.write_reports(workdir_lib.Workdir(str(tmp_path)),
                               config.from_preset("smoke", arms=("additive",), dims=(8,),
                                                  seeds=seeds))
  assert text.splitlines()[0].endswith(f"steps=120, {said}")
