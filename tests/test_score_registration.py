"""A score added in one place -- one `registry.Score` and its function -- is
taken by every list, both attention layers and the trainer of both families."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import layers, registry, scores
from attention_jax.data import input_pipeline
from attention_jax.score_kinds import Form
from attention_jax.sweep import config
from attention_jax.training import train_lib

NAME = "learned_scale"


def learned_scale(q, k, c):
  """`c · ⟨q, k⟩` of the projected query and key, `c` a learned scalar."""
  return c * scores.dot(q, k)


def one_scalar(dims, rngs):
  """`c`, starting at 1/2, one per layer."""
  del rngs
  return {"c": nnx.Param(jnp.full((), 0.5, dims.param_dtype))}


SCORE = registry.Score(NAME, "c · ⟨W_1 s + b_1, W_2 h + b_2⟩, c learned (starts at 1/2)",
                       "this test", rnn=Form(learned_scale, one_scalar), projected=True)


@pytest.fixture
def new_score():
  registry.register(SCORE)
  yield SCORE
  registry.unregister(NAME)  # the other tests see the built-in scores only


def test_a_registered_score_is_in_every_derived_list_until_it_is_removed(new_score):
  assert layers.SCORES == tuple(registry.SCORES) and layers.SCORES[-1] == NAME
  assert config.ARMS == tuple(registry.SCORES) + registry.NO_ATTENTION_ARMS
  assert NAME not in registry.FUNCTION_SCORES  # no pure function of (q, k) given
  assert config.Arm.of(NAME, 8).score == NAME
  with pytest.raises(ValueError, match="is taken"):
    registry.register(SCORE)
  registry.unregister(NAME)
  assert NAME not in layers.SCORES and NAME not in config.ARMS
  with pytest.raises(ValueError, match="`arms` must be one of"):
    config.Arm.of(NAME, 8)
  registry.register(SCORE)  # for the fixture to remove


def test_built_in_scores_cannot_be_removed_or_shadowed():
  with pytest.raises(ValueError, match="`name` must be a registered score"):
    registry.unregister("additive")
  with pytest.raises(ValueError, match="is taken"):
    registry.register(registry.Score("none_init", "", "", rnn=Form(scores.dot)))
  with pytest.raises(ValueError, match="`score.fused`"):
    registry.register(registry.Score("x", "", "", rnn=Form(scores.dot), fused="additive"))
  assert "x" not in registry.SCORES


def test_both_layers_compute_the_new_function_of_the_projections(new_score):
  attn = layers.Attention(6, 10, score=NAME, attention_dim=5, rngs=nnx.Rngs(0))
  assert {str(p[0]) for p, _ in nnx.to_flat_state(nnx.state(attn))} == {"query_proj", "key_proj", "c"}
  attn.c[...] = jnp.asarray(0.25)
  query = jax.random.normal(jax.random.key(1), (2, 3, 6))
  keys = jax.random.normal(jax.random.key(2), (2, 7, 10))
  q_proj, k_proj = np.asarray(attn.query_proj(query)), np.asarray(attn.key_proj(keys))
  np.testing.assert_allclose(attn.scores(query, attn.prepare(keys)),
                             0.25 * q_proj @ k_proj.transpose(0, 2, 1), rtol=1e-5, atol=1e-6)

  mha = layers.MultiHeadAttention(2, 8, score=NAME, rngs=nnx.Rngs(0))
  assert {str(p[0]) for p, _ in nnx.to_flat_state(nnx.state(mha))} == {
      "query", "key", "value", "out", "c"}
  x = jax.random.normal(jax.random.key(3), (2, 5, 8))
  _, aux = mha(x, return_weights=True)
  q, (k, _) = np.asarray(mha.project_query(x)), mha.project_kv(x)
  np.testing.assert_allclose(aux["scores"], 0.5 * q @ np.swapaxes(np.asarray(k), -1, -2),
                             rtol=1e-5, atol=1e-6)


def _last_name(path) -> str | None:
  """The attribute a parameter's tree path ends in (`['attention']['c']` -> 'c')."""
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return names[-1] if names else None


@pytest.mark.parametrize("model", ["rnn", "transformer"])
def test_the_new_score_trains_in_both_families(new_score, model):
  extra = dict(hidden_dim=16, num_heads=2) if model == "transformer" else {}
  cfg = config.from_preset("smoke", model=model, arms=(NAME,), dims=(8,), **extra)
  data = input_pipeline.load(cfg.dataset, max_length=cfg.max_length)
  trainer = train_lib.EnsembleTrainer(cfg.point(config.Arm.of(NAME, 8)), data, (0,))
  batch = next(trainer.train_batches(0))
  losses = []
  for _ in range(6):  # one batch, learnt
    trainer.state = trainer.step(trainer.state, batch)
    losses.append(float(trainer.state.loss[0]))
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
  c = [np.asarray(x)[0] for path, x in jax.tree_util.tree_leaves_with_path(trainer.params)
       if _last_name(path) == "c"]
  attention_layers = 1 if model == "rnn" else cfg.encoder_layers + 2 * cfg.decoder_layers
  assert len(c) == attention_layers
  assert all(abs(float(value) - 0.5) > 1e-4 for value in c)  # the gradient reaches c
