"""The multi-head layer's fused kernels (`score_kinds.Form.kernel`).

The per-head additive score's kernel is the Pallas one (`pallas_additive`),
which `pallas_additive.wins` takes only on a TPU or GPU where the plain path
would chunk its tanh block. Here, on a CPU, the rule is forced and the kernels
run in Pallas's interpret mode: the layer's output and gradients must equal
its plain path (logits, float32 softmax, weighted sum) with and without masks.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import pallas_additive
from attention_jax import registry
from attention_jax.attention import MaskStructure
from attention_jax.layers import MultiHeadAttention

B, T, S, D, H = 2, 5, 7, 16, 2


def _layer():
  return MultiHeadAttention(H, D, score="additive", rngs=nnx.Rngs(0))


def _inputs():
  kq, kkv = jax.random.split(jax.random.PRNGKey(1))
  return jax.random.normal(kq, (B, T, D)), jax.random.normal(kkv, (B, S, D))


def _value_and_grads(layer, x_q, x_kv, mask):
  graphdef, params = nnx.split(layer)

  def loss(params, x_q, x_kv):
    out, _ = nnx.merge(graphdef, params)(x_q, x_kv, mask=mask)
    return jnp.sum(jnp.sin(out)), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      params, x_q, x_kv)
  return out, grads


def _masks():
  lengths = jnp.array([S, 3])
  return {"none": None,
          "padding": (jnp.arange(S)[None, :] < lengths[:, None])[:, None, None, :],
          "causal_structure": MaskStructure(causal=True)}


@pytest.mark.parametrize("mask_name", list(_masks()))
def test_the_additive_kernel_equals_the_layers_plain_path(monkeypatch, mask_name):
  mask = _masks()[mask_name]
  x_q, x_kv = _inputs()
  plain_out, plain_grads = _value_and_grads(_layer(), x_q, x_kv, mask)
  taken = []

  def always(*args):
    taken.append(args)
    return True
  monkeypatch.setattr(pallas_additive, "wins", always)
  out, grads = _value_and_grads(_layer(), x_q, x_kv, mask)
  assert taken and taken[0][:4] == (B * H, T, S, D // H)  # lead, Tq, Tk, a
  np.testing.assert_allclose(out, plain_out, atol=2e-6, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_kernel_is_not_taken_on_a_cpu_or_where_the_weights_are_asked_for(monkeypatch):
  x_q, x_kv = _inputs()
  calls = []
  assert registry.get("additive").mha.kernel is not None
  # On this CPU the rule declines at any size: the plain path runs.
  assert not pallas_additive.wins(1, 4096, 4096, 1024, "cpu")
  assert pallas_additive.wins(1, 4096, 4096, 1024, "gpu")
  assert not pallas_additive.wins(1, 8, 8, 8, "gpu")  # small: one fused XLA program
  monkeypatch.setattr(pallas_additive, "wins", lambda *a: calls.append(a) or True)
  _, aux = _layer()(x_q, x_kv, return_weights=True)
  assert aux["weights"].shape == (B, H, T, S) and not calls
