"""An ensemble's members in one program: vmapped or in turn, the same function
(attention_jax/training/placement.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attention_jax import models
from attention_jax.training import placement
from attention_jax.training import steps


def test_in_turn_equals_vmap_with_shared_and_stacked_arguments():
  def fn(w, x, scale):
    return {"y": jnp.tanh(x @ w) * scale, "norm": jnp.sum(w * w)}
  w = jax.random.normal(jax.random.key(0), (3, 5, 4))  # 3 members
  x = jax.random.normal(jax.random.key(1), (6, 5))
  vmapped = placement.over_members(fn, (0, None, None), in_turn=False)(w, x, 2.0)
  in_turn = placement.over_members(fn, (0, None, None), in_turn=True)(w, x, 2.0)
  for key in ("y", "norm"):
    assert in_turn[key].shape == vmapped[key].shape
    # The same function up to float32 summation order: the batched and the
    # single matmul may take different kernels (on a 2-core AMD EPYC one of the
    # 72 entries differed by 2.4e-7, 2 ulps of the O(1) terms summed).
    np.testing.assert_allclose(in_turn[key], vmapped[key], rtol=1e-6, atol=1e-6)


def test_cpu_runs_members_in_turn():
  assert placement.in_turn_default() == (jax.default_backend() == "cpu")


@pytest.mark.parametrize("in_axes", [(1, None), (None, None)])
def test_bad_in_axes_are_refused(in_axes):
  with pytest.raises(ValueError, match="in_axes"):
    placement.over_members(lambda a, b: a, in_axes)


def test_the_training_step_of_two_seeds_is_the_same_in_turn_as_vmapped():
  config = models.Seq2SeqConfig(vocab_size=40, embed_dim=16, hidden_dim=16, attention_dim=24,
                                decoder_layers=1, dropout=0.2, score="multiplicative")
  graphdef, state = models.create_ensemble(models.Seq2Seq, config, (0, 1))
  params, rest = state.split(nnx.Param, ...)
  # SGD: the update is the gradient itself (Adam's first step, g / |g|, would blow
  # up the rounding of gradients that are zero in exact arithmetic).
  tx = optax.sgd(0.5)
  opt_state = jax.vmap(tx.init)(params)
  rng = np.random.default_rng(0)
  tgt = rng.integers(3, 40, (8, 9)).astype(np.int32)
  src = rng.integers(3, 40, (8, 7)).astype(np.int32)
  tgt_in = steps.decoder_input(tgt, config.sos_id, config.pad_id)
  step = functools.partial(steps.train_step, graphdef, tx, pad_id=0)

  def member(p, r, o, seed, src, tgt_in, tgt_out):
    return step(p, r, o, src, tgt_in, tgt_out, jax.random.fold_in(jax.random.PRNGKey(seed), 3))

  seeds = jnp.asarray([0, 1], jnp.uint32)
  out = {}
  for in_turn in (False, True):
    fn = placement.over_members(member, (0, 0, 0, 0, None, None, None), in_turn=in_turn)
    out[in_turn] = jax.jit(fn)(params, rest, opt_state, seeds, src, tgt_in, tgt)
  (p_v, _, loss_v), (p_t, _, loss_t) = out[False], out[True]
  assert loss_t.shape == (2,) and abs(float(loss_t[0] - loss_t[1])) > 1e-4  # members differ
  np.testing.assert_allclose(loss_t, loss_v, rtol=2e-6)
  for a, b in zip(jax.tree.leaves(p_t), jax.tree.leaves(p_v)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
