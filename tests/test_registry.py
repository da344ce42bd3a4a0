"""The score registry is the one list: every derived list and every layer agree with it."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import layers, registry, scores
from attention_jax.attention import select_implementation
from attention_jax.training import config


def test_derived_lists_follow_the_registry():
  assert layers.SCORES == tuple(registry.SCORES)
  assert registry.FUNCTION_SCORES == tuple(n for n, s in registry.SCORES.items() if s.function)
  assert config.ARMS == tuple(registry.SCORES) + registry.NO_ATTENTION_ARMS
  for spec in registry.SCORES.values():  # fused names are pure dot-product scores
    assert spec.fused in (None, "dot", "scaled_dot")
    assert (spec.dot_product is None) or spec.function is not None
    # every parameter a pure function requires is a named parameter of it
    for param in spec.function_params + spec.function_options:
      assert param in inspect.signature(spec.function).parameters, (spec.name, param)


# The score's own parameters (beyond the projections) in each layer: their
# names are the paths of the layers' state, which checkpoints are read by.
RNN_PARAMS = {"additive": {"v": (5,)}, "qk_norm": {"g": ()}, "general": {"w": (6, 6)},
              "cosine": {"beta": ()},
              "location": {"location_proj": {"kernel": (6, 9), "bias": (9,)}}}
MHA_PARAMS = {"additive": {"w_q": (2, 4, 4), "w_k": (2, 4, 4), "v": (2, 4)},
              "qk_norm": {"g": ()}, "general": {"w": (2, 4, 4)}, "cosine": {"beta": (2,)},
              "location": {"w_loc": (2, 4, 9), "b_loc": (2, 9)}}


def _shapes(module, names):
  state = nnx.to_pure_dict(nnx.state(module))
  return {n: jax.tree.map(lambda x: tuple(x.shape), state[n]) for n in names}


@pytest.mark.parametrize("name", registry.LAYER_SCORES)
def test_each_layer_has_exactly_the_parameters_of_its_form(name):
  spec = registry.SCORES[name]
  layer = layers.Attention(6, 6, score=name, attention_dim=5, max_source_length=9,
                           rngs=nnx.Rngs(0))
  own = set(nnx.state(layer)) - {"query_proj", "key_proj"}
  assert hasattr(layer, "query_proj") == hasattr(layer, "key_proj") == spec.projected
  assert set(layer.score_params) == own == set(RNN_PARAMS.get(name, {}))
  assert _shapes(layer, own) == RNN_PARAMS.get(name, {})
  mha = layers.MultiHeadAttention(2, 8, score=name, max_length=9, rngs=nnx.Rngs(0))
  own = set(nnx.state(mha)) - {"query", "key", "value", "out"}
  assert set(mha.score_params) == own == set(MHA_PARAMS.get(name, {}))
  assert _shapes(mha, own) == MHA_PARAMS.get(name, {})


@pytest.mark.parametrize("name", registry.LAYER_SCORES)
def test_rnn_attention_layer_checks_what_the_registry_says(name):
  spec = registry.SCORES[name]
  if spec.same_dim:
    with pytest.raises(ValueError, match="query_dim == key_dim"):
      layers.Attention(6, 8, score=name, rngs=nnx.Rngs(0))
  else:
    layers.Attention(6, 8, score=name, attention_dim=4, max_source_length=5,
                     rngs=nnx.Rngs(0))
  if spec.needs_length:
    with pytest.raises(ValueError, match="max_source_length"):
      layers.Attention(6, 6, score=name, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", [n for n, s in registry.SCORES.items() if s.fused])
def test_fused_scores_give_the_plain_result_in_the_multi_head_layer(name):
  mha = layers.MultiHeadAttention(2, 8, score=name, rngs=nnx.Rngs(0))
  t = 512  # long enough that `auto` hands the heads to the blockwise kernel on CPUs
  x = jax.random.normal(jax.random.key(1), (2, t, 8))
  mask = jnp.arange(t)[None, None, None, :] < jnp.asarray([t, 300])[:, None, None, None]
  q, (k, v) = mha.project_query(x), mha.project_kv(x)
  fused = registry.SCORES[name].fused
  expected_kernel = "blockwise" if jax.default_backend() == "cpu" else "fused"
  assert select_implementation(fused, "auto", q, k, v) == expected_kernel
  assert select_implementation(fused, "auto", q, k, v, return_weights=True) == "plain"
  handed_over, _ = mha(x, mask=mask)  # no weights asked: attention() computes it
  own, aux = mha(x, mask=mask, return_weights=True)  # the layer's own scores
  np.testing.assert_allclose(handed_over, own, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(aux["scores"], getattr(scores, fused)(q, k), rtol=1e-5, atol=1e-5)


def test_unknown_score_names_the_field():
  with pytest.raises(ValueError, match="`arms` must be one of"):
    registry.get("bogus", "arms")
  with pytest.raises(ValueError, match="`score`"):
    layers.MultiHeadAttention(2, 8, score="bogus", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name,decoder,score", [
    ("additive", "luong", "additive"),
    ("scaled_multiplicative", "luong", "scaled_multiplicative"),
    ("none_init", "none_init", None),
    ("none_concat", "none_concat", None),
])
def test_an_arm_is_resolved_once_into_decoder_and_score(name, decoder, score):
  arm = config.Arm.of(name, 64)
  assert (arm.decoder, arm.score, arm.attention_dim) == (decoder, score, 64)
  assert arm.has_attention == (score is not None)
  assert arm.label == f"{name} d=64"
  sweep = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8, 32)).sweep()
  assert [(a.name, a.attention_dim) for a in sweep] == [
      ("additive", 8), ("additive", 32), ("multiplicative", 8), ("multiplicative", 32)]
