"""Tests for attention_jax.layers: `Attention` (RNN) and `MultiHeadAttention`.

References are written in NumPy (float64) from the formulas in docs/formulas.md §3-4,
reading the layers' parameters.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import layers, registry
from attention_jax.attention import MaskStructure
from attention_jax.layers import SCORES, Attention, MultiHeadAttention


def _np(x):
  return np.asarray(x, np.float64)


def _softmax_masked(e, mask):
  e = np.where(mask, e, -np.inf)
  m = np.max(e, axis=-1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  w = np.where(mask, np.exp(e - m), 0.0)
  s = w.sum(-1, keepdims=True)
  return w / np.where(s > 0, s, 1.0)


def _linear(layer, x):
  out = _np(x) @ _np(layer.kernel[...])
  return out + _np(layer.bias[...]) if layer.bias is not None else out


# -- Attention (single head, RNN decoders) -------------------------------------


def _np_score_params(layer):
  """The layer's own score parameters as NumPy float64, by name (a module, e.g.
  `location_proj`, as the dict of its parameters)."""
  out = {}
  for name in layer.score_params:
    p = getattr(layer, name)
    out[name] = (_np(p[...]) if isinstance(p, nnx.Variable)
                 else jax.tree.map(_np, nnx.to_pure_dict(nnx.state(p))))
  return out


def _reference_of(form, score):
  assert form.reference is not None, f"score {score!r}: its Form has no NumPy `reference`"
  return form.reference


def _rnn_reference(attn, query, keys):
  """NumPy scores [B, Tq, S]: the entry's `rnn.reference` of the NumPy
  projections (projected scores) or the states, with the layer's parameters."""
  q, k = _np(query), _np(keys)
  if attn.spec.projected:
    q, k = _linear(attn.query_proj, q), _linear(attn.key_proj, k)
  return _reference_of(attn.spec.rnn, attn.score)(q, k, **_np_score_params(attn))


def _rnn_layer(score, seed=0):
  key_dim = 6 if registry.get(score).same_dim else 10
  return Attention(6, key_dim, score=score, attention_dim=5, max_source_length=9,
                   rngs=nnx.Rngs(seed)), key_dim


@pytest.mark.parametrize("score", SCORES)
def test_attention_scores_and_weights_match_numpy(score):
  attn, key_dim = _rnn_layer(score)
  kq, kk = jax.random.split(jax.random.key(1))
  query = jax.random.normal(kq, (2, 3, 6))
  keys = jax.random.normal(kk, (2, 7, key_dim))
  mask = jnp.arange(7)[None, None, :] < jnp.array([7, 4])[:, None, None]  # [B, 1, S]
  context, weights, scores = attn(query, attn.prepare(keys), keys, mask=mask)
  want_scores = _rnn_reference(attn, query, keys)
  want_weights = _softmax_masked(want_scores, np.asarray(mask))
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(context, want_weights @ _np(keys), rtol=1e-5, atol=1e-5)
  assert weights.dtype == scores.dtype == jnp.float32
  assert np.all(np.asarray(weights)[1, :, 4:] == 0.0)


def test_attention_score_offset_is_added_before_softmax():
  attn, _ = _rnn_layer("additive")
  query = jax.random.normal(jax.random.key(2), (2, 1, 6))
  keys = jax.random.normal(jax.random.key(3), (2, 5, 10))
  prepared = attn.prepare(keys)
  _, w0, e0 = attn(query, prepared, keys)
  # A constant shift per query row leaves the softmax unchanged.
  _, w1, e1 = attn(query, prepared, keys, score_offset=jnp.full((2, 1, 5), 3.0))
  np.testing.assert_allclose(w1, w0, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(e1, e0)  # scores are reported raw
  # A large offset on key 2 moves (almost) all weight there.
  offset = jnp.zeros((2, 1, 5)).at[:, :, 2].set(50.0)
  _, w2, _ = attn(query, prepared, keys, score_offset=offset)
  assert np.all(np.asarray(w2)[:, 0, 2] > 0.999)
  with pytest.raises(ValueError, match="score_offset"):
    attn(query, prepared, keys, score_offset=jnp.zeros((2, 5)))


def test_attention_bad_arguments():
  with pytest.raises(ValueError, match="`score` must be one of"):
    Attention(4, 4, score="concat", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="query_dim == key_dim"):
    Attention(4, 8, score="dot", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="max_source_length"):
    Attention(4, 8, score="location", rngs=nnx.Rngs(0))
  attn = Attention(4, 8, score="location", max_source_length=3, rngs=nnx.Rngs(0))
  keys = jnp.ones((1, 5, 8))
  with pytest.raises(ValueError, match="max_source_length=3"):
    attn(jnp.ones((1, 1, 4)), attn.prepare(keys), keys)


# -- MultiHeadAttention -------------------------------------------------------


def _heads(x, h):  # [B, T, H·d] -> [B, H, T, d]
  b, t, f = x.shape
  return x.reshape(b, t, h, f // h).transpose(0, 2, 1, 3)


def _mha_reference(mha, xq, xkv, mask):
  """NumPy multi-head attention: (out [B, T, D], scores, weights [B, H, T, S]),
  the scores the entry's `mha.reference` of the NumPy head projections."""
  h, s = mha.num_heads, mha.score
  q = _heads(_linear(mha.query, xq), h)
  k = _heads(_linear(mha.key, xkv), h)
  v = _heads(_linear(mha.value, xkv), h)
  e = _reference_of(mha.spec.mha, s)(q, k, **_np_score_params(mha))
  w = _softmax_masked(e, np.asarray(mask))
  ctx = (w @ v).transpose(0, 2, 1, 3).reshape(xq.shape[0], xq.shape[1], -1)
  return _linear(mha.out, ctx), e, w


def _mha(score, dtype=jnp.float32, seed=0, **kw):
  return MultiHeadAttention(4, 16, score=score, max_length=12, dtype=dtype,
                            rngs=nnx.Rngs(seed), **kw)


def _inputs(b=2, t=5, s=7, d=16):
  k1, k2 = jax.random.split(jax.random.key(7))
  xq = jax.random.normal(k1, (b, t, d))
  xkv = jax.random.normal(k2, (b, s, d))
  valid = jnp.arange(s)[None, :] < jnp.array([s, 3])[:, None]  # [B, S]
  return xq, xkv, valid[:, None, None, :]  # mask [B, 1, 1, S]


@pytest.mark.parametrize("score", SCORES)
def test_mha_matches_numpy_reference(score):
  mha = _mha(score)
  xq, xkv, mask = _inputs()
  out, aux = mha(xq, xkv, mask=mask, return_weights=True)
  want_out, want_scores, want_weights = _mha_reference(mha, xq, xkv, mask)
  np.testing.assert_allclose(aux["scores"], want_scores, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(aux["weights"], want_weights, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
  assert aux["weights"].shape == (2, 4, 5, 7) and aux["weights"].dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(aux["weights"]).sum(-1), 1.0, rtol=1e-5)
  assert np.all(np.asarray(aux["weights"])[1, :, :, 3:] == 0.0)


@pytest.mark.parametrize("score", ["scaled_dot", "dot"])
def test_mha_fused_path_equals_plain_path(score):
  mha = _mha(score)
  xq, xkv, mask = _inputs()
  fused, aux = mha(xq, xkv, mask=mask)  # no weights requested: fused kernel
  plain, _ = mha(xq, xkv, mask=mask, return_weights=True)
  assert aux is None
  np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("handed_over", [False, True])
def test_mha_mask_structure_gives_the_result_of_its_dense_mask(handed_over, monkeypatch):
  # Handed over: `attention` gets causal and the lengths (here computing plain).
  if handed_over:
    monkeypatch.setattr(layers, "select_implementation", lambda *a, **k: "fused")
  mha = _mha("scaled_dot")
  x = jax.random.normal(jax.random.key(3), (2, 6, 16))
  structure = MaskStructure(causal=True, query_lengths=jnp.array([6, 4]),
                            key_lengths=jnp.array([6, 4]))
  dense = jnp.tril(jnp.ones((6, 6), bool)) & (jnp.arange(6) < jnp.array([6, 4])[:, None])[
      :, None, :, None] & (jnp.arange(6) < jnp.array([6, 4])[:, None])[:, None, None, :]
  want, _ = mha(x, mask=dense)
  got, _ = mha(x, mask=structure)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(structure.dense(6, 6), dense)
  assert np.all(np.asarray(got)[1, 4:] == np.asarray(mha.out.bias[...]))  # padded queries


def test_mha_hands_a_mask_structure_over_as_causal_and_lengths(monkeypatch):
  # What cuDNN needs to apply the masks inside its kernel: no dense mask.
  seen = {}

  def fake_attention(q, k, v, **kw):
    seen.update(kw)
    return jnp.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)

  monkeypatch.setattr(layers, "attention", fake_attention)
  monkeypatch.setattr(layers, "select_implementation", lambda *a, **k: "fused")
  x = jnp.ones((2, 6, 16))
  _mha("scaled_dot")(x, mask=MaskStructure(causal=True, key_lengths=jnp.array([6, 4])))
  assert seen["causal"] is True and seen.get("mask") is None
  np.testing.assert_array_equal(seen["key_lengths"], [6, 4])
  seen.clear()
  _mha("scaled_dot")(x, mask=jnp.ones((2, 1, 6, 6), bool))  # a dense mask stays dense
  assert seen["mask"].shape == (2, 1, 6, 6) and "causal" not in seen


def test_mha_multiplicative_is_dot_on_the_head_projections():
  xq, xkv, mask = _inputs()
  for a, b in (("multiplicative", "dot"), ("scaled_multiplicative", "scaled_dot")):
    out_a, _ = _mha(a)(xq, xkv, mask=mask)
    out_b, _ = _mha(b)(xq, xkv, mask=mask)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-6, atol=1e-6)


def test_mha_qk_features_sets_the_scaled_dot_denominator():
  mha = MultiHeadAttention(2, 8, qk_features=32, rngs=nnx.Rngs(0))
  xq, xkv, mask = _inputs(d=8)
  _, aux = mha(xq, xkv, mask=mask, return_weights=True)
  q = _heads(_linear(mha.query, xq), 2)
  k = _heads(_linear(mha.key, xkv), 2)
  assert q.shape[-1] == 32
  np.testing.assert_allclose(aux["scores"], q @ k.transpose(0, 1, 3, 2) / np.sqrt(32),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("score", ["scaled_dot", "additive", "cosine", "general"])
def test_mha_bfloat16_compute_is_close_to_float32(score):
  xq, xkv, mask = _inputs()
  f32, bf16 = _mha(score), _mha(score, dtype=jnp.bfloat16)
  out32, aux32 = f32(xq, xkv, mask=mask, return_weights=True)
  out16, aux16 = bf16(xq, xkv, mask=mask, return_weights=True)
  assert bf16.query.kernel[...].dtype == jnp.float32  # params stay float32
  assert out16.dtype == jnp.bfloat16 and aux16["weights"].dtype == jnp.float32
  scale = float(jnp.max(jnp.abs(out32)))
  np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=0.03 * scale)
  np.testing.assert_allclose(aux16["weights"], aux32["weights"], atol=0.03)
  assert not np.allclose(np.asarray(out16, np.float32), out32, atol=1e-7)  # really bf16


def test_mha_dropout_on_weights():
  mha = _mha("scaled_dot", dropout_rate=0.5)
  xq, xkv, mask = _inputs()
  det, aux_det = mha(xq, xkv, mask=mask, return_weights=True)
  with pytest.raises(ValueError, match="rngs"):
    mha(xq, xkv, mask=mask, deterministic=False)
  a, aux_a = mha(xq, xkv, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=1),
                 return_weights=True)
  b, _ = mha(xq, xkv, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=1))
  c, _ = mha(xq, xkv, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=2))
  np.testing.assert_array_equal(a, b)  # same key, same mask
  assert float(jnp.max(jnp.abs(a - det))) > 1e-3
  assert float(jnp.max(jnp.abs(a - c))) > 1e-3
  # The returned weights are the softmax before dropout.
  np.testing.assert_allclose(aux_a["weights"], aux_det["weights"], rtol=1e-6)


@pytest.mark.parametrize("score", ["scaled_dot", "additive", "location"])
def test_mha_cached_decoding_matches_causal_self_attention(score):
  mha = _mha(score)
  x = jax.random.normal(jax.random.key(3), (2, 6, 16))
  causal = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  full, aux = mha(x, mask=causal, return_weights=True)
  cache = mha.init_cache(2, 10)
  step = jax.jit(lambda x_t, cache, i: mha.decode_step(x_t, cache, i, return_weights=True))
  for t in range(6):
    out, cache, step_aux = step(x[:, t:t + 1], cache, t)
    np.testing.assert_allclose(out[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(step_aux["weights"][:, :, 0, :t + 1],
                               aux["weights"][:, :, t, :t + 1], rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(step_aux["weights"])[:, :, 0, t + 1:] == 0.0)


def test_mha_score_offset_and_errors():
  mha = _mha("additive")
  xq, xkv, mask = _inputs()
  _, aux0 = mha(xq, xkv, mask=mask, return_weights=True)
  _, aux1 = mha(xq, xkv, mask=mask, return_weights=True,
                score_offset=jnp.full((2, 4, 5, 7), -2.0))
  np.testing.assert_allclose(aux1["weights"], aux0["weights"], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="score_offset"):
    mha(xq, xkv, mask=mask, score_offset=jnp.zeros((2, 5, 7)))
  with pytest.raises(ValueError, match="divisible by `num_heads`"):
    MultiHeadAttention(3, 16, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="`score` must be one of"):
    MultiHeadAttention(4, 16, score="bilinear", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="max_length"):
    MultiHeadAttention(4, 16, score="location", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="dropout_rate"):
    MultiHeadAttention(4, 16, dropout_rate=1.0, rngs=nnx.Rngs(0))
  short = MultiHeadAttention(4, 16, score="location", max_length=4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="max_length=4"):
    short(xq, xkv)


def test_mha_runs_under_jit_and_vmap_after_split_merge():
  graphdef, state = nnx.split(_mha("additive"))
  xq, xkv, mask = _inputs()
  eager, _ = nnx.merge(graphdef, state)(xq, xkv, mask=mask)
  apply = lambda st, a, b: nnx.merge(graphdef, st)(a, b, mask=mask)[0]
  np.testing.assert_allclose(jax.jit(apply)(state, xq, xkv), eager, rtol=1e-5, atol=1e-6)
  stacked = jax.tree.map(lambda x: jnp.stack([x, x]), state)
  both = jax.jit(jax.vmap(apply, in_axes=(0, None, None)))(stacked, xq, xkv)
  np.testing.assert_allclose(both[1], eager, rtol=1e-5, atol=1e-6)


def test_dropout_key_accepts_rngs_streams_and_keys():
  key = jax.random.key(0)
  assert layers.dropout_key(None) is None
  assert layers.dropout_key(key) is key
  assert layers.dropout_key(nnx.Rngs(dropout=0)).shape == ()
  with pytest.raises(TypeError, match="rngs"):
    layers.dropout_key(3)


def test_qk_norm_starts_g_at_henrys_value_and_learns_it():
  attn = Attention(6, 10, score="qk_norm", attention_dim=5, max_source_length=33,
                   rngs=nnx.Rngs(0))
  np.testing.assert_allclose(float(attn.g[...]), np.log2(33 ** 2 - 33), rtol=1e-6)
  mha = MultiHeadAttention(4, 16, score="qk_norm", max_length=12, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(float(mha.g[...]), np.log2(12 ** 2 - 12), rtol=1e-6)
  # g is a trained parameter: the loss has a nonzero gradient with respect to it.
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  grads = nnx.grad(lambda m: jnp.sum(m(x)[0] ** 2))(mha)
  assert float(jnp.abs(grads.g[...])) > 0.0


def test_dense_is_the_linear_layer_over_the_last_axis():
  layer = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (3, 5, 2, 6))
  y = layers.dense(layer, x)
  assert y.shape == (3, 5, 2, 4)
  np.testing.assert_allclose(y, layer(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend,flattened", [("cpu", True), ("tpu", False), ("gpu", False)])
def test_dense_flattens_only_on_cpus(monkeypatch, backend, flattened):
  """The 2-D product is an XLA:CPU remedy; on a TPU its reshapes cost
  (results/compile_check), so elsewhere the layer takes its input as it is."""
  layer = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
  x = jnp.ones((3, 5, 6))
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  eqns = jax.make_jaxpr(lambda x: layers.dense(layer, x))(x).jaxpr.eqns
  [product] = [e for e in eqns if e.primitive.name == "dot_general"]
  assert product.invars[0].aval.shape == ((15, 6) if flattened else (3, 5, 6))
