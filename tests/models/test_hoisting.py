"""The GRU input projections made outside the scans (accelerators' form,
`seq2seq.hoists_input_projections`) give the per-step form's loss and
gradients, with dropout on, and take products out of the loops."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.models import seq2seq
from attention_jax.training import steps
from tests.models.test_seq2seq import V, model_of, small

RNG = np.random.default_rng(0)
SRC = RNG.integers(3, V, (4, 7)).astype(np.int32)
SRC[1, 5:] = 0  # a shorter sentence: the encoder's lengths matter
TGT = RNG.integers(3, V, (4, 6)).astype(np.int32)

GRU_CONFIGS = {
    "luong_context_feeding": small(),
    "luong_attentional_feeding": small(input_feeding="attentional"),
    "luong_no_feeding": small(input_feeding="none", score="multiplicative"),
    "bahdanau": small(decoder="bahdanau"),
    "none_concat_2_layers": small(decoder="none_concat", encoder_layers=2),
    "none_init_unidirectional": small(decoder="none_init", bidirectional=False),
}


def loss_fn(config):
  tgt_in = steps.decoder_input(TGT, config.sos_id, config.pad_id)

  def loss(m):
    logits, _ = m(SRC, tgt_in, deterministic=False, rngs=jax.random.key(3))
    return steps.token_loss(logits, TGT, config.pad_id, label_smoothing=0.1)[0]
  return loss


def loss_and_grads(config, hoist, monkeypatch, unroll=1):
  """The loss and gradients of `config`'s model, compiled (one program)."""
  monkeypatch.setattr(seq2seq, "hoists_input_projections", lambda: hoist)
  monkeypatch.setattr(seq2seq, "scan_unroll", lambda: unroll)
  graphdef, state = nnx.split(model_of(config))
  loss = loss_fn(config)
  return jax.jit(jax.value_and_grad(lambda st: loss(nnx.merge(graphdef, st))))(state)


# Over 8 s each on the loaded 2-core machine: the two decoders that read the
# context differently are covered by default (Bahdanau here, Luong with the GPU
# unroll below), the others run in `make test-all`.
DEFAULT = ("bahdanau",)  # the Luong decoder: the unrolled test below


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in GRU_CONFIGS])
def test_hoisted_projections_give_the_per_step_loss_and_gradients(name, monkeypatch):
  config = GRU_CONFIGS[name]
  plain_loss, plain_grads = loss_and_grads(config, False, monkeypatch)
  hoisted_loss, hoisted_grads = loss_and_grads(config, True, monkeypatch)
  # Dropout is on: equal losses mean the hoisted masks are the per-step ones.
  np.testing.assert_allclose(hoisted_loss, plain_loss, rtol=1e-6)
  plain_leaves, hoisted_leaves = jax.tree.leaves(plain_grads), jax.tree.leaves(hoisted_grads)
  assert len(plain_leaves) == len(hoisted_leaves) > 10
  for a, b in zip(hoisted_leaves, plain_leaves):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert max(float(jnp.max(jnp.abs(g))) for g in hoisted_leaves) > 1e-3


@pytest.mark.slow
def test_hoisted_bfloat16_stays_within_bfloat16_rounding(monkeypatch):
  config = small(dtype=jnp.bfloat16)
  plain_loss, _ = loss_and_grads(config, False, monkeypatch)
  hoisted_loss, _ = loss_and_grads(config, True, monkeypatch)
  np.testing.assert_allclose(hoisted_loss, plain_loss, rtol=2e-2)


def _loop_products(config, hoist, monkeypatch):
  """(count, total contraction size) of the dot products inside the scans of
  the forward and backward pass."""
  monkeypatch.setattr(seq2seq, "hoists_input_projections", lambda: hoist)
  graphdef, state = nnx.split(model_of(config))

  def loss(state):
    return loss_fn(config)(nnx.merge(graphdef, state))
  jaxpr = jax.make_jaxpr(jax.grad(loss))(state).jaxpr
  found = []

  def walk(jxp, inside):
    for eqn in jxp.eqns:
      if inside and eqn.primitive.name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        shape = eqn.invars[0].aval.shape
        found.append(int(np.prod([shape[d] for d in contract])))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub, inside or eqn.primitive.name == "scan")
  walk(jaxpr, False)
  return len(found), sum(found)


def test_hoisting_takes_the_input_products_out_of_the_loops(monkeypatch):
  config = GRU_CONFIGS["luong_context_feeding"]
  plain = _loop_products(config, False, monkeypatch)
  hoisted = _loop_products(config, True, monkeypatch)
  # The encoder's two directions lose their input products (forward, and the
  # input and weight gradients backward); the decoder's first cell keeps a
  # smaller one (the feed's columns only).
  assert hoisted[0] < plain[0]
  assert hoisted[1] < plain[1]


def test_lstm_cells_are_not_hoisted(monkeypatch):
  config = small(cell="lstm")
  assert _loop_products(config, True, monkeypatch) == _loop_products(config, False, monkeypatch)


@pytest.mark.parametrize("platform, hoists, unroll", [("cpu", False, 1), ("tpu", False, 1),
                                                     ("gpu", True, 2)])
def test_only_gpus_hoist_and_unroll(platform, hoists, unroll, monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: platform)
  assert seq2seq.hoists_input_projections() is hoists
  assert seq2seq.scan_unroll() == unroll


def test_the_gpus_unrolled_hoisted_scans_give_the_per_step_loss_and_gradients(monkeypatch):
  # Source length 7 and target length 6: the encoder's scans end in a step of
  # their own (7 is odd), the decoder's in a whole pair.
  config = GRU_CONFIGS["luong_context_feeding"]
  plain_loss, plain_grads = loss_and_grads(config, False, monkeypatch)
  gpu_loss, gpu_grads = loss_and_grads(config, True, monkeypatch, unroll=2)
  np.testing.assert_allclose(gpu_loss, plain_loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(gpu_grads), jax.tree.leaves(plain_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
