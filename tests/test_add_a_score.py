"""The README's "To add a score", followed literally: a score defined and
registered in this module alone -- a scaled dot product times a learned
positive temperature per head -- matches its NumPy reference in both layers,
is in the benchmark's naive-vs-library comparison against its own naive form,
trains in both model families and has its learned parameter logged in the
diagnostics. No other file names it, and it is removed after each test."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import layers, registry, scores
from attention_jax.measure import benchmarking
from attention_jax.data import input_pipeline
from attention_jax.score_kinds import Form
from attention_jax.sweep import config
from attention_jax.training import train_lib

NAME = "learned_temperature_scaled_dot"


# 1. Its formula (what `attention(score=NAME)` computes) and its parameters.
def learned_temperature_scaled_dot(q, k, t=0.0):
  """`exp(t) · qᵀk / √d`: the temperature exp(t) stays positive whatever t learns."""
  return jnp.exp(jnp.asarray(t, jnp.float32)) * scores.scaled_dot(q, k)


def per_head(q, k, t):
  """The multi-head layer's logits: one temperature per head, `t [H]`."""
  return learned_temperature_scaled_dot(q, k, t[:, None, None])


def temperature(dims, rngs):
  """`t` = 0 (temperature 1, scaled_dot at the start); one per head."""
  del rngs
  shape = () if dims.heads is None else (dims.heads,)
  return {"t": nnx.Param(jnp.zeros(shape, dims.param_dtype))}


# 2. Its NumPy reference (the layers' tests) and naive form (the benchmark).
def reference(q, k, t):
  """float64: `exp(t) · q kᵀ / √d`, t scalar or per head `[H]`."""
  t = np.reshape(t, np.shape(t) + (1, 1))
  return np.exp(t) * (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])


def naive(q, k, t=0.0):
  """float32 einsum: `exp(t) · qᵀk / √d`."""
  q, k = jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32)
  products = jnp.einsum("...qd,...kd->...qk", q, k, precision=jax.lax.Precision.HIGHEST)
  return jnp.exp(jnp.asarray(t, jnp.float32)) * products / math.sqrt(q.shape[-1])


# 3. Its one entry, registered for the duration of each test.
# `projected`: the RNN layer scores its projections `W_1 s + b_1`, `W_2 h + b_2`
# (a features; the bidirectional encoder's states are twice the decoder's), as
# the multi-head layer scores its head projections.
SCORE = registry.Score(
    NAME, "exp(t) · ⟨W_1 s + b_1, W_2 h + b_2⟩ / √a, t learned per head (starts at 0)",
    "this test", rnn=Form(learned_temperature_scaled_dot, temperature, reference),
    mha=Form(per_head, temperature, reference), projected=True,
    function=learned_temperature_scaled_dot, function_options=("t",), naive=naive,
    logged_params={"t": "log_temperature"})


@pytest.fixture
def new_score():
  with registry.registered(SCORE):
    yield SCORE
  assert NAME not in registry.SCORES  # the other tests see the built-in scores only


def _np(x):
  return np.asarray(x, np.float64)


def test_both_layers_match_the_entrys_reference(new_score):
  attn = layers.Attention(6, 10, score=NAME, attention_dim=5, rngs=nnx.Rngs(0))
  assert attn.score_params == ("t",) and attn.t[...].shape == ()
  attn.t[...] = jnp.asarray(0.7)
  query = jax.random.normal(jax.random.key(1), (2, 3, 6))
  keys = jax.random.normal(jax.random.key(2), (2, 7, 10))
  q_proj, k_proj = attn.query_proj(query), attn.key_proj(keys)  # [B, T, 5], [B, S, 5]
  np.testing.assert_allclose(attn.scores(query, attn.prepare(keys)),
                             reference(_np(q_proj), _np(k_proj), _np(attn.t[...])),
                             rtol=1e-5, atol=1e-5)
  mha = layers.MultiHeadAttention(2, 8, score=NAME, rngs=nnx.Rngs(0))
  assert mha.score_params == ("t",) and mha.t[...].shape == (2,)
  mha.t[...] = jnp.asarray([0.5, -1.0])
  x = jax.random.normal(jax.random.key(3), (2, 5, 8))
  _, aux = mha(x, return_weights=True)
  q, (k, _) = mha.project_query(x), mha.project_kv(x)
  np.testing.assert_allclose(aux["scores"], reference(_np(q), _np(k), _np(mha.t[...])),
                             rtol=1e-4, atol=1e-5)


def test_it_is_in_the_benchmarks_comparison_against_its_reference(new_score):
  q = jax.random.normal(jax.random.key(4), (2, 6, 8))
  k = jax.random.normal(jax.random.key(5), (2, 9, 8))
  weights = jax.random.normal(jax.random.key(6), (4, 8, 8)) / math.sqrt(8)
  params = {"w": weights[0], "w_q": weights[1], "w_k": weights[2], "v": weights[3, 0],
            "beta": 2.0, "t": 0.3}  # every parametrised score's, as the benchmark has
  rows = {r["score"]: r for r in benchmarking.naive_comparison(q, k, params)}
  assert list(rows) == list(registry.SCORES)
  compared = [n for n, r in rows.items() if r["status"] == "ok"]
  assert compared == list(registry.FUNCTION_SCORES) and NAME in compared
  for row in rows.values():  # the library agrees with every naive form, the new one too
    assert row["status"] != "ok" or row["max_abs_err"] <= 1e-4 * max(1.0, row["max_abs_ref"])
  assert {r["status"] for n, r in rows.items() if n not in compared} == {"no pure function"}
  assert rows[NAME]["max_abs_ref"] > 0
  assert benchmarking.naive_comparison(q, k)[0] == {
      "score": "additive", "status": "params missing: w_q, w_k, v"}
  # its reference is its own: exp(0.3) times scaled_dot's scores
  np.testing.assert_allclose(benchmarking.naive_scores(NAME, q, k, {"t": 0.3}),
                             math.exp(0.3) * benchmarking.naive_scores("scaled_dot", q, k),
                             rtol=1e-6)
  # a pure score without a naive form is reported as such, not left out
  no_naive = registry.Score(NAME + "_unchecked", "", "this test",
                            rnn=Form(learned_temperature_scaled_dot, temperature),
                            function=learned_temperature_scaled_dot)
  with registry.registered(no_naive):
    rows = {r["score"]: r for r in benchmarking.naive_comparison(q, k)}
    assert rows[no_naive.name] == {"score": no_naive.name, "status": "no naive form"}
    with pytest.raises(ValueError, match=f"`score` '{no_naive.name}' has no naive form"):
      benchmarking.naive_scores(no_naive.name, q, k)


def _leaves_named(params, name):
  """The arrays of `params` whose tree path ends in `name` (an nnx.Param's
  array path ends in 'value')."""
  out = []
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    if keys and keys[-1] == "value":
      keys = keys[:-1]
    if keys and keys[-1] == name:
      out.append(np.asarray(x))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["rnn", "transformer"])
def test_it_trains_in_both_families_and_logs_its_temperature(new_score, model):
  extra = dict(hidden_dim=16, num_heads=2) if model == "transformer" else {}
  cfg = config.from_preset("smoke", model=model, arms=(NAME,), dims=(8,), **extra)
  assert cfg.dataset == "copy"  # the smoke preset's synthetic copy task
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  trainer = train_lib.EnsembleTrainer(cfg.point(config.Arm.of(NAME, 8)), data, (0,))
  batch = next(trainer.train_batches(0))
  losses = []
  for _ in range(6):  # one batch, learnt
    trainer.state = trainer.step(trainer.state, batch)
    losses.append(float(trainer.state.loss[0]))
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
  t = _leaves_named(trainer.params, "t")
  modules = 1 if model == "rnn" else cfg.encoder_layers + 2 * cfg.decoder_layers
  assert len(t) == modules and all(np.any(np.abs(x) > 1e-5) for x in t)  # t learnt
  stats = trainer.diagnose(trainer.params, batch)
  logged = sorted(k for k in stats if k.startswith("log_temperature"))
  expected = ["log_temperature"] if model == "rnn" else [  # one per layer, kind and head
      f"log_temperature_{kind}_l0_{h}" for kind in ("cross", "decoder_self", "encoder_self")
      for h in range(2)]
  assert logged == expected
  np.testing.assert_allclose(sorted(np.ravel([stats[k][0] for k in logged])),
                             sorted(np.concatenate([np.ravel(x[0]) for x in t])), rtol=1e-6)
