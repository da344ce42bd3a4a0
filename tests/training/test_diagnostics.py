import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import attend
from attention_jax.training import diagnostics


# Jitted: one compiled program per shape where eager mode compiled each of its
# ~100 operations (about 3 s a test on 2 cores); test_jit_matches_eager checks
# that the two agree.
@jax.jit
def _stats(scores, key_valid, query_valid):
  values = jnp.zeros(scores.shape[:-2] + (scores.shape[-1], 1))  # [B, Tk, 1]
  _, weights = attend(scores, values, key_valid & query_valid)
  return diagnostics.softmax_stats(scores, weights, key_valid, query_valid)


def test_uniform_rows_have_entropy_one_and_zero_std():
  scores = jnp.full((2, 3, 5), 4.0)
  key_valid = jnp.array([[True] * 5, [True] * 3 + [False] * 2])[:, None, :]
  query_valid = jnp.ones((2, 3, 1), bool)
  s = _stats(scores, key_valid, query_valid)
  assert float(s["entropy"]) == pytest.approx(1.0, abs=1e-6)
  assert float(s["logit_std"]) == pytest.approx(0.0, abs=1e-6)
  assert float(s["saturated"]) == 0.0


def test_peaked_rows_are_saturated_with_zero_entropy():
  scores = jnp.zeros((1, 4, 6)).at[..., 2].set(100.0)
  ones = jnp.ones((1, 4, 6), bool)
  s = _stats(scores, ones, ones)
  assert float(s["saturated"]) == 1.0
  assert float(s["entropy"]) == pytest.approx(0.0, abs=1e-5)
  # std of [0,0,100,0,0,0] is 100 * sqrt(5) / 6
  assert float(s["logit_std"]) == pytest.approx(100 * np.sqrt(5) / 6, rel=1e-5)


def test_matches_numpy_and_ignores_masked_keys_and_queries():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(3, 4, 7)).astype(np.float32) * 3
  lengths = np.array([7, 4, 2])
  key_valid = (np.arange(7)[None, :] < lengths[:, None])[:, None, :]
  query_valid = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], bool)[:, :, None]
  s = _stats(jnp.asarray(scores), jnp.asarray(key_valid), jnp.asarray(query_valid))
  stds, ents, sats, peak = [], [], [], -np.inf
  for b in range(3):
    for t in range(4):
      if not query_valid[b, t, 0]:
        continue
      row = scores[b, t, :lengths[b]].astype(np.float64)
      peak = max(peak, row.max())
      p = np.exp(row - row.max())
      p /= p.sum()
      stds.append(row.std())
      ents.append(-(p * np.log(p)).sum() / np.log(lengths[b]))
      sats.append(p.max() > 0.99)
  assert float(s["logit_std"]) == pytest.approx(np.mean(stds), rel=1e-4)
  assert float(s["entropy"]) == pytest.approx(np.mean(ents), rel=1e-4)
  assert float(s["saturated"]) == pytest.approx(np.mean(sats))
  assert float(s["max_logit"]) == pytest.approx(peak, rel=1e-6)
  # Garbage at masked keys and masked queries changes nothing.
  noisy = np.where(key_valid & query_valid, scores, 1e4).astype(np.float32)
  s2 = _stats(jnp.asarray(noisy), jnp.asarray(key_valid), jnp.asarray(query_valid))
  for k in s:
    assert float(s2[k]) == pytest.approx(float(s[k]), rel=1e-5)


def test_max_logit_by_hand():
  # Row maxima 2 (key 1), 9 (key 2, but masked), 5 (query masked): the answer is 2,
  scores = jnp.asarray([[[1.0, 2.0, 9.0], [0.5, -1.0, 5.0]]])  # [1, 2, 3]
  key_valid = jnp.asarray([True, True, False])[None, None, :]
  query_valid = jnp.asarray([True, False])[None, :, None]
  assert float(_stats(scores, key_valid, query_valid)["max_logit"]) == 2.0
  # ... and 9 once key 2 is valid; a negative maximum stays negative.
  assert float(_stats(scores, jnp.ones((1, 1, 3), bool), query_valid)["max_logit"]) == 9.0
  assert float(_stats(-scores - 3.0, key_valid, query_valid)["max_logit"]) == -4.0


def test_query_valid_like_shapes():
  tv = jnp.ones((2, 5), bool)
  assert diagnostics.query_valid_like(3, tv).shape == (2, 5, 1)
  assert diagnostics.query_valid_like(5, tv).shape == (1, 2, 1, 5, 1)
  with pytest.raises(ValueError, match="rank 4"):
    diagnostics.query_valid_like(4, tv)


def test_jit_matches_eager():
  scores = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4))
  ones = jnp.ones((2, 3, 4), bool)
  _, w = attend(scores, jnp.zeros((2, 4, 1)))
  eager = diagnostics.softmax_stats(scores, w, ones, ones)
  jitted = jax.jit(diagnostics.softmax_stats)(scores, w, ones, ones)
  for k in eager:
    np.testing.assert_allclose(eager[k], jitted[k], rtol=1e-6)


def test_qk_norm_gains_are_named_like_the_max_logits():
  rnn = {"attention": {"g": jnp.float32(9.5), "w1": jnp.ones(2)}, "embed": {"g2": 1.0}}
  assert {k: float(v) for k, v in diagnostics.qk_norm_gains(rnn).items()} == {"qk_norm_g": 9.5}
  transformer = {"encoder_layers": {0: {"self_attn": {"g": 1.0}}},
                 "decoder_layers": {1: {"self_attn": {"g": 2.0}, "cross_attn": {"g": 3.0}}},
                 "elsewhere": {"g": 4.0}}
  assert diagnostics.qk_norm_gains(transformer) == {
      "qk_norm_g_encoder_self_l0": 1.0, "qk_norm_g_decoder_self_l1": 2.0,
      "qk_norm_g_cross_l1": 3.0, "qk_norm_g_elsewhere": 4.0}
  assert diagnostics.qk_norm_gains({"attention": {"w1": jnp.ones(2)}}) == {}
