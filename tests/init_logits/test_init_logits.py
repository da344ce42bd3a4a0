"""The footnote at initialisation (`experiments/init_logits/run.py`, its probes and
tables in `analysis/init_logits_{probes,tables}.py`) and the power-law fit it
reports (`analysis/scaling.py`): the fit recovers known exponents, the
measurement recovers the footnote's √d_k on data that meets its premise, the
probes read the models' own logits, and a tiny run of the command yields
complete, finite rows and its table and figure."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import scores as scores_lib
from experiments.init_logits import probes
from experiments.init_logits import tables
from attention_jax.analysis import scaling
from attention_jax.data import input_pipeline
from attention_jax.measure import provenance
from experiments.init_logits import run as init_logits

DIMS = (16, 32, 64, 128, 256, 512, 1024)


# -- loglog_slope --------------------------------------------------------------


def test_slope_is_exact_on_a_power_law():
  x = np.array([8, 16, 32, 64, 128, 256, 512, 1024], float)
  slope, lo, hi = scaling.loglog_slope(x, 3.0 * x ** -0.37)
  assert slope == pytest.approx(-0.37, abs=1e-12)
  assert lo == pytest.approx(slope, abs=1e-9) and hi == pytest.approx(slope, abs=1e-9)


def test_interval_contains_the_exponent_on_noisy_data():
  rng = np.random.default_rng(0)
  x = np.array(DIMS, float)
  y = 2.0 * x ** 0.5 * np.exp(rng.normal(0.0, 0.1, x.shape))
  slope, lo, hi = scaling.loglog_slope(x, y)
  assert lo < 0.5 < hi
  assert lo < slope < hi and hi - lo < 0.3


def test_interval_covers_the_exponent_about_95_percent_of_the_time():
  rng = np.random.default_rng(1)
  x = np.array([8, 16, 32, 64], float)  # 2 dof: a normal quantile would undercover badly
  hits = 0
  for _ in range(400):
    slope, lo, hi = scaling.loglog_slope(x, x ** 0.5 * np.exp(rng.normal(0.0, 0.2, 4)))
    hits += lo <= 0.5 <= hi
  assert 0.92 <= hits / 400 <= 0.98


@pytest.mark.parametrize("dof,expected", [(1, 12.7062), (2, 4.3027), (5, 2.5706),
                                          (10, 2.2281), (1000, 1.9623)])
def test_t_quantile_matches_the_tables(dof, expected):
  assert scaling.t_quantile(0.975, dof) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("x,y,needle", [
    ([1, 2], [1, 2], "`x` must hold at least 3 points"),
    ([1, 2, 3], [1, 2], "`x` and `y` must have the same length"),
    ([1, 0, 3], [1, 2, 3], "`x` must hold finite positive values"),
    ([1, 2, 3], [1, -2, 3], "`y` must hold finite positive values"),
    ([1, 2, 3], [1, np.nan, 3], "`y` must hold finite positive values"),
    ([4, 4, 4], [1, 2, 3], "`x` must hold at least two distinct values"),
])
def test_slope_errors_name_the_argument(x, y, needle):
  with pytest.raises(ValueError, match=needle):
    scaling.loglog_slope(x, y)


def test_slope_and_quantile_refuse_bad_levels():
  with pytest.raises(ValueError, match="`confidence`"):
    scaling.loglog_slope([1, 2, 3], [1, 2, 3], confidence=1.0)
  with pytest.raises(ValueError, match="`p`"):
    scaling.t_quantile(0.4, 3)
  with pytest.raises(ValueError, match="`dof`"):
    scaling.t_quantile(0.975, 0)


# -- the footnote on data that meets its premise -------------------------------


def _premise_stats(dim, score, seed):
  """Logit statistics of iid N(0, 1) queries and keys, 8 of 16 keys of the
  second sentence padded."""
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((4, 16, dim)), jnp.float32)  # [B, T, d]
  k = jnp.asarray(rng.standard_normal((4, 16, dim)), jnp.float32)  # [B, S, d]
  s = getattr(scores_lib, score)(q, k)  # [B, T, S]
  key_valid = jnp.ones((4, 1, 16), bool).at[1, :, 8:].set(False)
  query_valid = jnp.ones((4, 16, 1), bool)
  weights = jax.nn.softmax(jnp.where(key_valid, s, -jnp.inf), axis=-1)
  stats = probes.attention_stats(s, weights, key_valid, query_valid)
  return {name: float(v) for name, v in stats.items()}, q


def test_unscaled_logit_std_grows_as_sqrt_dk_and_scaled_stays_flat():
  unscaled = [_premise_stats(d, "dot", d)[0]["logit_std"] for d in DIMS]
  scaled = [_premise_stats(d, "scaled_dot", d)[0]["logit_std"] for d in DIMS]
  slope, _, _ = scaling.loglog_slope(DIMS, unscaled)
  assert slope == pytest.approx(0.5, abs=0.05)
  slope, _, _ = scaling.loglog_slope(DIMS, scaled)
  assert slope == pytest.approx(0.0, abs=0.05)
  # std over ~16 keys of q·k/√d with |q|²/d ≈ 1: just under 1 at every d.
  assert all(0.8 < s < 1.05 for s in scaled)


def test_premise_data_has_unit_component_variance_and_the_masks_hold():
  stats, q = _premise_stats(256, "dot", 3)
  var, square = probes.component_moments(q, jnp.ones(q.shape[:2], bool))
  assert float(var) == pytest.approx(1.0, abs=0.05)
  assert float(square) == pytest.approx(1.0, abs=0.05)
  assert stats["max_abs_logit"] >= stats["max_logit"] > 0
  assert 0.0 < stats["entropy"] < 1.0 and 0.0 <= stats["saturated"] <= 1.0


def test_component_moments_separate_variance_from_mean_square():
  rng = np.random.default_rng(0)
  x = 3.0 + rng.standard_normal((8, 64, 32))
  valid = np.ones((8, 64), bool)
  valid[:, 40:] = False
  x[:, 40:] = 1e6  # padding: must not count
  var, square = probes.component_moments(x, valid)
  assert float(var) == pytest.approx(1.0, abs=0.05)
  assert float(square) == pytest.approx(10.0, abs=0.3)


# -- the report, on rows with a known answer ----------------------------------


def _rows(model, init, score, std_of_dim):
  return [dict(model=model, init=init, score=score, dim=d, kind=kind, layer=layer,
               logit_std=std_of_dim(d) * (1 + layer), max_abs_logit=3.0 * std_of_dim(d),
               max_logit=3.0 * std_of_dim(d), saturated=0.25, entropy=0.5, q_var=1.0,
               k_var=1.0, q_mean_square=1.0, k_mean_square=1.0)
          for d in (8, 16, 32, 64) for kind in tables.KINDS for layer in (0, 1)]


def test_report_fits_the_pooled_power_laws():
  rows = (_rows("transformer", "default", "dot", lambda d: 5.0 * d ** -0.25)
          + _rows("transformer", "premise", "dot", lambda d: 2.0 * d ** 0.5))
  entries = {e["init"]: e for e in tables.summary(rows)}
  for init, exponent in (("default", -0.25), ("premise", 0.5)):
    for slope in (entries[init]["logit_std_slope"], entries[init]["max_abs_logit_slope"],
                  *entries[init]["kind_slopes"].values()):
      assert slope == pytest.approx((exponent,) * 3, abs=1e-9)
  assert entries["premise"]["std_first"] == pytest.approx(2.0 * 8 ** 0.5 * 1.5)
  assert entries["premise"]["saturated_last"] == 0.25
  table = tables.table_markdown(rows)
  assert "| premise | dot | +0.500 [+0.500, +0.500] | +0.500 [+0.500, +0.500] |" in table


# -- the probes and a tiny run of the command ----------------------------------


TINY = dict(dims=(4, 8), batches=1, dataset="copy", max_length=12, batch_size=8,
            d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1)


@pytest.fixture(scope="module")
def copy_data():
  return input_pipeline.load("copy", max_length=12, num_train=64, num_valid=8, num_test=8,
                             min_len=3, max_len=10)


def _model_aux(model, src, tgt_in):
  """The model's own teacher-forced `aux`, compiled."""
  graphdef, state = nnx.split(model)
  return jax.jit(lambda st: nnx.merge(graphdef, st)(src, tgt_in)[1])(state)


def test_probes_read_the_models_own_logits(copy_data):
  settings = init_logits.Settings(**TINY)
  src, tgt_in = init_logits.first_batches(copy_data, settings)[0]
  transformer = init_logits.build_model(settings, "transformer", "dot", 8, copy_data)
  aux = _model_aux(transformer, src, tgt_in)
  sites = probes.compiled_sites("transformer", transformer, src, tgt_in)
  kinds = [k for k, _, _ in probes.attention_modules(transformer)]
  assert kinds == ["encoder_self", "decoder_self", "cross"]
  np.testing.assert_allclose(sites[2].scores, aux["scores"][0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(sites[2].weights, aux["weights"][0], rtol=1e-5, atol=1e-6)
  assert sites[0].q.shape == (8, src.shape[1], 2 * 8)  # [B, T, H·d_k]

  rnn = init_logits.build_model(settings, "rnn", "additive", 8, copy_data)
  aux = _model_aux(rnn, src, tgt_in)
  (site,) = probes.compiled_sites("rnn", rnn, src, tgt_in)
  np.testing.assert_allclose(site.scores, aux["scores"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(site.weights, aux["weights"], rtol=1e-5, atol=1e-6)
  assert site.q.shape == (8, tgt_in.shape[1], 8)


def test_premise_gives_unit_mean_square_and_touches_only_queries_and_keys(copy_data):
  settings = init_logits.Settings(**TINY)
  src, tgt_in = init_logits.first_batches(copy_data, settings)[0]
  model = init_logits.build_model(settings, "transformer", "dot", 8, copy_data)
  value = np.array(model.encoder_layers[0].self_attn.value.kernel[...])
  before = probes.batch_stats("transformer", model, src, tgt_in)
  probes.apply_premise("transformer", model, src, tgt_in, jax.random.key(1), passes=2)
  after = probes.batch_stats("transformer", model, src, tgt_in)
  for stats in after:
    assert stats["q_mean_square"] == pytest.approx(1.0, rel=0.02)
    assert stats["k_mean_square"] == pytest.approx(1.0, rel=0.02)
  assert any(abs(b["q_mean_square"] - 1.0) > 0.1 for b in before)
  np.testing.assert_array_equal(model.encoder_layers[0].self_attn.value.kernel[...], value)
  np.testing.assert_array_equal(model.decoder_layers[0].cross_attn.query.bias[...], 0.0)


def test_tiny_run_writes_complete_finite_rows_and_reports(copy_data, tmp_path):
  settings = init_logits.Settings(**TINY, transformer_scores=("dot",),
                                  rnn_scores=("multiplicative",))
  rows, skipped = init_logits.measure(settings, copy_data, log=lambda _: None)
  assert skipped == []
  # transformer: 2 dims x 2 inits x 3 modules; rnn: 2 dims x 2 inits x 1 module
  assert len(rows) == 2 * 2 * 3 + 2 * 2
  fields = {"model", "init", "score", "dim", "kind", "layer", "batches", "logit_std",
            "max_logit", "max_abs_logit", "saturated", "entropy", "q_var", "k_var",
            "q_mean_square", "k_mean_square"}
  for row in rows:
    assert set(row) == fields
    numbers = [row[f] for f in fields - {"model", "init", "score", "kind"}]
    assert all(math.isfinite(v) for v in numbers), row
    assert row["logit_std"] > 0 and 0 <= row["saturated"] <= 1 and 0 < row["entropy"] <= 1
    assert row["max_abs_logit"] >= row["max_logit"]
  premise = [r for r in rows if r["init"] == "premise"]
  assert all(r["q_mean_square"] == pytest.approx(1.0, rel=0.05) for r in premise)
  assert all(r["k_mean_square"] == pytest.approx(1.0, rel=0.05) for r in premise)

  init_logits.write_outputs(str(tmp_path), rows)
  written = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
  # the rows as measured, each with this process's provenance (the shared record)
  assert [{k: v for k, v in w.items() if k != "provenance"} for w in written] == rows
  assert written[0]["provenance"] == provenance.fields()
  assert len(written[0]["provenance"]["commit"]) == 40
  table = (tmp_path / "table.md").read_text()
  for score in ("dot", "multiplicative"):
    assert f"| default | {score} |" in table and f"| premise | {score} |" in table
  assert os.path.getsize(tmp_path / "logit_std.png") > 1000
  # what the numbers say is written by hand in the results' README, not here
  assert sorted(os.listdir(tmp_path)) == ["logit_std.png", "results.jsonl", "table.md"]


def test_settings_name_the_bad_argument():
  with pytest.raises(ValueError, match="`batches`"):
    init_logits.Settings(batches=0)
  with pytest.raises(ValueError, match="`dims`"):
    init_logits.Settings(dims=(8, 8, 16))
  with pytest.raises(ValueError, match="`models`"):
    init_logits.Settings(models=("lstm",))
  with pytest.raises(ValueError, match="`rnn_scores`"):
    init_logits.Settings(rnn_scores=("cosine",))


# -- the command line ----------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_BAD_FLAGS = [
    ("--num_heads=3", "`num_heads` (3)"),      # a traceback in the Transformer's config
    ("--dataset=bogus", "'bogus'"),            # a traceback in the data loader
    ("--dims=8,x", "`dims`"),
    ("--batches=0", "`batches`"),
    ("--rnn_scores=cosine", "`rnn_scores`"),
    ("--out=FILE", "--out"),                   # minutes of measuring, then a traceback
    ("--out=FILE/below", "--out"),
]


def _bad_command(folder, flag):
  """A tiny run but for the bad flag (given last, it wins), from `folder`,
  which holds a file FILE."""
  (folder / "FILE").write_text("not a folder")
  return ["--models=rnn", "--dims=8", flag.replace("FILE", str(folder / "FILE"))]


def _check_refused(proc, folder, needle):
  # Each printed absl's usage of every flag (135 lines) or a traceback.
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, proc.stderr[-3000:]
  assert err[0].startswith("error: ") and needle in err[0]
  assert sorted(os.listdir(folder)) == ["FILE"]  # nothing written, not even runs/


@pytest.fixture(scope="module")
def refused_in_one_process(tmp_path_factory, run_refusals):
  """Every bad flag run through the driver's `main` in one process, each from a
  folder of its own (tests/drivers.py): flag -> (result, folder)."""
  folders = [tmp_path_factory.mktemp("bad_flag") for _ in _BAD_FLAGS]
  results = run_refusals("experiments.init_logits.run",
                         [(_bad_command(folder, flag), folder)
                          for folder, (flag, _) in zip(folders, _BAD_FLAGS)],
                         define="define_flags")
  return {flag: (result, folder)
          for (flag, _), result, folder in zip(_BAD_FLAGS, results, folders)}


def test_a_bad_flag_stops_the_real_process_with_one_line_before_any_work(tmp_path):
  # The process itself once (the one whose traceback came from the config); the
  # others run through the same `main` in one process below.
  proc = subprocess.run([sys.executable, "-m", "experiments.init_logits.run",
                         *_bad_command(tmp_path, "--num_heads=3")], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": ROOT})
  _check_refused(proc, tmp_path, "`num_heads` (3)")


@pytest.mark.parametrize("flag,needle", _BAD_FLAGS)
def test_a_bad_flag_is_one_line_before_any_work(refused_in_one_process, flag, needle):
  proc, folder = refused_in_one_process[flag]
  _check_refused(proc, folder, needle)


def test_without_out_it_writes_to_a_scratch_folder_not_the_committed_results(tmp_path):
  # It replaced the committed results/init_logits with whatever toy run it made.
  assert init_logits.SCRATCH_OUT == os.path.join("runs", "init_logits")
  assert init_logits.checked_out(None) == init_logits.SCRATCH_OUT
  assert init_logits.checked_out(str(tmp_path / "new")) == str(tmp_path / "new")
  assert not (tmp_path / "new").exists()  # checked, not made
