"""Property tests (hypothesis) over random shapes, masks, dtypes and magnitudes.

The invariant everywhere: no NaN or Inf in outputs or gradients, and the
attention weights form a distribution over valid keys (or are all zero).
Example counts come from the profile in conftest.py.

Shape glossary: Tq / Tk lengths, d features, a attention size.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st

import attention_jax as aj
from attention_jax import masks, positional, registry, scores

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Few distinct sizes, so that examples share compiled programs.
SIZES = st.sampled_from([1, 2, 3, 5])


@st.composite
def attention_problems(draw):
  lead = tuple(draw(st.lists(st.sampled_from([1, 2, 3]), max_size=2)))
  tq, tk, d = draw(SIZES), draw(SIZES), draw(st.sampled_from([1, 4, 6]))
  score = draw(st.sampled_from(registry.FUNCTION_SCORES))
  implementations = ["plain"] + (["xla", "auto"] if score in ("dot", "scaled_dot") else [])
  return dict(
      lead=lead, tq=tq, tk=tk, d=d, score=score,
      implementation=draw(st.sampled_from(implementations)),
      dtype=draw(st.sampled_from(sorted(DTYPES))),
      # Large magnitudes push scores far into the softmax tails.
      magnitude=draw(st.sampled_from([1.0, 30.0, 1e4])),
      mask_kind=draw(st.sampled_from(["none", "random", "all_masked", "causal_padding"])),
      keep=draw(st.floats(0.0, 1.0)),
      seed=draw(st.integers(0, 2 ** 16)))


def _mask(p, rng):
  shape = p["lead"] + (p["tq"], p["tk"])
  if p["mask_kind"] == "none":
    return None
  if p["mask_kind"] == "random":
    return rng.random(shape) < p["keep"]
  if p["mask_kind"] == "all_masked":
    return np.zeros(shape, bool)
  # Causal over the key axis (query i sees keys j <= i) and random key padding.
  causal = np.arange(p["tk"])[None, :] <= np.arange(p["tq"])[:, None]  # [Tq, Tk]
  key_valid = rng.random(p["lead"][:1] + (1,) * max(len(p["lead"]) - 1, 0) + (1, p["tk"]))
  return masks.combine(causal, key_valid < p["keep"])


@functools.partial(jax.jit, static_argnames=("score", "implementation"))
def _context_grads_weights(q, k, v, params, mask, *, score, implementation):
  """One compiled program per example: context, its gradients, plain weights."""

  def loss(q, k, v, params):
    context = aj.attention(q, k, v, score=score, params=params, mask=mask,
                           implementation=implementation)
    return jnp.sum(context.astype(jnp.float32) ** 2), context

  (_, context), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
      q, k, v, params)
  _, weights = aj.attention(q, k, v, score=score, params=params, mask=mask,
                            return_weights=True)
  return context, grads, weights


@given(attention_problems())
def test_attention_outputs_and_gradients_are_finite(p):
  rng = np.random.default_rng(p["seed"])
  dtype = DTYPES[p["dtype"]]
  normal = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32), dtype)
  lead, d = p["lead"], p["d"]
  q = p["magnitude"] * normal(*lead, p["tq"], d)  # [..., Tq, d]
  k = p["magnitude"] * normal(*lead, p["tk"], d)  # [..., Tk, d]
  v = normal(*lead, p["tk"], d)  # [..., Tk, d]
  params = {"w": normal(d, d), "w_q": normal(d, 3), "w_k": normal(d, 3), "v": normal(3),
            "beta": normal()}
  mask = _mask(p, rng)

  context, grads, weights = _context_grads_weights(
      q, k, v, params, mask, score=p["score"], implementation=p["implementation"])
  assert context.dtype == dtype and context.shape == lead + (p["tq"], d)
  assert np.all(np.isfinite(np.asarray(context, np.float32)))
  for g in jax.tree.leaves(grads):
    assert np.all(np.isfinite(np.asarray(g, np.float32)))

  weights = np.asarray(weights)
  assert weights.dtype == np.float32 and np.all(np.isfinite(weights))
  assert np.all(weights >= 0.0)
  full_mask = np.ones(weights.shape, bool) if mask is None else np.broadcast_to(mask, weights.shape)
  assert np.all(weights[~full_mask] == 0.0)
  any_valid = full_mask.any(-1)
  np.testing.assert_allclose(weights.sum(-1)[any_valid], 1.0, rtol=1e-5)
  assert np.all(weights.sum(-1)[~any_valid] == 0.0)
  assert np.all(np.asarray(context, np.float32)[~any_valid] == 0.0)


@given(tq=st.integers(1, 9), tk=SIZES, a=st.sampled_from([1, 4]),
       block=st.integers(1, 64), seed=st.integers(0, 2 ** 16))
def test_additive_chunked_equals_naive_for_any_block(tq, tk, a, block, seed):
  rng = np.random.default_rng(seed)
  normal = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))
  args = (normal(2, tq, 3), normal(2, tk, 3), normal(3, a), normal(3, a), normal(a))
  out = scores.additive(*args, block_elements=block)
  assert out.shape == (2, tq, tk)
  np.testing.assert_allclose(out, scores.additive_naive(*args), rtol=1e-5, atol=1e-5)


@given(dtype=st.sampled_from(sorted(DTYPES)), zero_rows=st.lists(st.booleans(), min_size=4,
                                                                   max_size=4),
       beta=st.floats(-50.0, 50.0), seed=st.integers(0, 2 ** 16))
def test_cosine_is_bounded_and_finite_with_zero_vectors(dtype, zero_rows, beta, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(4, 5)).astype(np.float32)
  x[np.array(zero_rows)] = 0.0
  x = jnp.asarray(x, DTYPES[dtype])  # [T, d]; some rows are zero vectors
  out, grad = jax.value_and_grad(
      lambda x: jnp.sum(scores.cosine(x, x, beta).astype(jnp.float32)))(x)
  bound = abs(beta) * (1 + 1e-2)  # bf16 rounding of beta and of the unit vectors
  assert np.all(np.abs(np.asarray(scores.cosine(x, x, beta), np.float32)) <= bound + 1e-6)
  assert np.isfinite(float(out)) and np.all(np.isfinite(np.asarray(grad, np.float32)))
  assert np.all(np.asarray(scores.cosine(x, x, beta), np.float32)[np.array(zero_rows)] == 0.0)


@given(length=st.integers(1, 300), dim=st.integers(1, 65))
def test_sinusoidal_is_finite_bounded_and_starts_at_sin0_cos0(length, dim):
  table = np.asarray(positional.sinusoidal(length, dim))
  assert table.shape == (length, dim) and table.dtype == np.float32
  assert np.all(np.isfinite(table)) and np.all(np.abs(table) <= 1.0)
  np.testing.assert_array_equal(table[0], np.arange(dim) % 2)  # sin 0 = 0, cos 0 = 1


@given(shape_a=st.lists(st.sampled_from([1, 3]), min_size=1, max_size=3),
       shape_b=st.lists(st.sampled_from([1, 3]), min_size=1, max_size=3),
       seed=st.integers(0, 2 ** 16))
def test_combine_equals_numpy_and(shape_a, shape_b, seed):
  rng = np.random.default_rng(seed)
  a, b = rng.random(shape_a) < 0.5, rng.random(shape_b) < 0.5
  np.testing.assert_array_equal(masks.combine(a, None, b), np.logical_and(a, b))
