"""Tests for attention_jax.masks (True = may attend).

Shape glossary: B batch, H heads, T / Tq / Tk lengths.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import attend, masks


@pytest.mark.parametrize("length", [1, 2, 5])
def test_causal_lets_query_i_see_keys_up_to_i(length):
  mask = masks.causal(length)
  assert mask.shape == (length, length) and mask.dtype == jnp.bool_
  for i in range(length):
    for j in range(length):
      assert bool(mask[i, j]) == (j <= i)


def test_causal_accepts_numpy_int():
  np.testing.assert_array_equal(masks.causal(np.int64(3)), masks.causal(3))


@pytest.mark.parametrize("pad_id", [0, 3])
def test_padding_marks_real_tokens(pad_id):
  tokens = np.array([[5, 3, 0, 0], [3, 3, 7, 0]])
  mask = masks.padding(tokens, pad_id=pad_id)
  assert mask.shape == (2, 4) and mask.dtype == jnp.bool_
  np.testing.assert_array_equal(mask, tokens != pad_id)


def test_padding_default_pad_id_is_zero():
  np.testing.assert_array_equal(masks.padding(np.array([4, 0, 1, 0])),
                                [True, False, True, False])


def test_cross_is_outer_and_with_head_axis():
  rng = np.random.default_rng(0)
  query_valid = rng.random((3, 4)) < 0.6  # [B, Tq]
  key_valid = rng.random((3, 5)) < 0.6  # [B, Tk]
  mask = masks.cross(query_valid, key_valid)
  assert mask.shape == (3, 1, 4, 5) and mask.dtype == jnp.bool_
  for b in range(3):
    for i in range(4):
      for j in range(5):
        assert bool(mask[b, 0, i, j]) == (query_valid[b, i] and key_valid[b, j])


def test_cross_broadcasts_leading_axes():
  query_valid = np.ones((1, 2), bool)  # [1, Tq]
  key_valid = np.array([[True, False, True], [False, True, True]])  # [2, Tk]
  mask = masks.cross(query_valid, key_valid)
  assert mask.shape == (2, 1, 2, 3)
  np.testing.assert_array_equal(mask[:, 0, 0, :], key_valid)
  np.testing.assert_array_equal(mask[:, 0, 1, :], key_valid)


def test_combine_is_broadcast_logical_and_ignoring_none():
  rng = np.random.default_rng(1)
  a = rng.random((2, 1, 4, 4)) < 0.5  # [B, 1, T, T]
  b = masks.causal(4)  # [T, T]
  c = rng.random((2, 3, 1, 4)) < 0.5  # [B, H, 1, T]
  out = masks.combine(a, None, b, c)
  assert out.shape == (2, 3, 4, 4) and out.dtype == jnp.bool_
  np.testing.assert_array_equal(out, a & np.asarray(b) & c)
  np.testing.assert_array_equal(masks.combine(None, a), a)
  assert masks.combine() is None
  assert masks.combine(None, None) is None


def test_combine_is_order_independent():
  rng = np.random.default_rng(2)
  a, b = rng.random((3, 4)) < 0.5, rng.random((1, 4)) < 0.5
  np.testing.assert_array_equal(masks.combine(a, b), masks.combine(b, a))


# --- jit / vmap ---------------------------------------------------------------
# Masks carry no float inputs, so they have no gradient of their own; gradients
# through masked attention are checked in test_attention.py.


def test_jit_equals_eager():
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, 3, size=(2, 5))
  qv, kv = rng.random((2, 4)) < 0.5, rng.random((2, 5)) < 0.5
  np.testing.assert_array_equal(jax.jit(masks.causal, static_argnums=0)(5), masks.causal(5))
  np.testing.assert_array_equal(jax.jit(masks.padding)(tokens), masks.padding(tokens))
  np.testing.assert_array_equal(
      jax.jit(lambda t: masks.padding(t, pad_id=2))(tokens), masks.padding(tokens, pad_id=2))
  np.testing.assert_array_equal(jax.jit(masks.cross)(qv, kv), masks.cross(qv, kv))
  a, b = masks.cross(qv, kv), masks.causal(5)[:4]
  np.testing.assert_array_equal(jax.jit(masks.combine)(a, b), masks.combine(a, b))


def test_vmap_equals_python_loop():
  rng = np.random.default_rng(4)
  tokens = rng.integers(0, 3, size=(3, 2, 5))
  qv, kv = rng.random((3, 4)) < 0.5, rng.random((3, 5)) < 0.5
  a, b = rng.random((3, 4, 5)) < 0.5, rng.random((3, 4, 5)) < 0.5
  for fn, args in ((masks.padding, (tokens,)), (masks.cross, (qv, kv)),
                   (masks.combine, (a, b))):
    mapped = jax.vmap(fn)(*args)
    looped = jnp.stack([fn(*(x[i] for x in args)) for i in range(3)])
    np.testing.assert_array_equal(mapped, looped)


def test_masks_compose_with_attend_and_keep_gradients_finite():
  rng = np.random.default_rng(5)
  tokens = np.array([[1, 2, 0], [0, 0, 0]])  # sequence 1 is all padding
  valid = masks.padding(tokens)  # [B, T]
  mask = masks.combine(masks.causal(3), masks.cross(valid, valid))  # [B, 1, T, T]
  scores = jnp.asarray(rng.normal(size=(2, 2, 3, 3)), jnp.float32)  # [B, H, T, T]
  values = jnp.asarray(rng.normal(size=(2, 2, 3, 4)), jnp.float32)  # [B, H, T, dv]
  grads = jax.grad(lambda s, v: jnp.sum(attend(s, v, mask)[0] ** 2), argnums=(0, 1))(
      scores, values)
  for g in grads:
    assert np.all(np.isfinite(g))
  assert np.all(np.asarray(grads[0])[1] == 0.0)  # nothing attends in sequence 1


# --- Bad input -----------------------------------------------------------------


@pytest.mark.parametrize("length", [0, -3])
def test_causal_rejects_non_positive_length(length):
  with pytest.raises(ValueError, match="`length` must be > 0"):
    masks.causal(length)


@pytest.mark.parametrize("length", [2.0, "4", True, None, np.float32(3)])
def test_causal_rejects_non_int_length(length):
  with pytest.raises(TypeError, match="`length` must be a Python int"):
    masks.causal(length)


def test_causal_rejects_traced_length_at_trace_time():
  with pytest.raises(TypeError, match="`length`"):
    jax.jit(masks.causal)(4)


@pytest.mark.parametrize("dtype", [np.float32, np.bool_, jnp.bfloat16])
def test_padding_rejects_non_integer_tokens(dtype, raises_at_trace):
  tokens = np.zeros((2, 5), dtype)
  raises_at_trace(masks.padding, (tokens,), TypeError, "`tokens`", "integer",
                  str(jnp.dtype(dtype)))


def test_padding_rejects_scalar_tokens(raises_at_trace):
  raises_at_trace(masks.padding, (np.int32(3),), ValueError, "`tokens`", "rank >= 1", "()")


@pytest.mark.parametrize("which", ["query_valid", "key_valid"])
def test_cross_rejects_non_boolean(which, raises_at_trace):
  good, bad = np.ones((2, 4), bool), np.ones((2, 4), np.int32)
  args = (bad, good) if which == "query_valid" else (good, bad)
  raises_at_trace(masks.cross, args, TypeError, f"`{which}`", "boolean", "int32", "(2, 4)")


def test_cross_rejects_unbroadcastable_leading_axes(raises_at_trace):
  raises_at_trace(masks.cross, (np.ones((2, 4), bool), np.ones((3, 5), bool)),
                  ValueError, "query_valid", "key_valid", "(2,)", "(3,)")


def test_combine_rejects_non_boolean_and_bad_shapes(raises_at_trace):
  ok = np.ones((4, 4), bool)
  raises_at_trace(lambda a, b: masks.combine(a, None, b), (ok, np.ones((4, 4), np.float32)),
                  TypeError, "`masks[2]`", "boolean", "float32")
  raises_at_trace(masks.combine, (ok, np.ones((3, 4), bool)),
                  ValueError, "`masks[0]`", "`masks[1]`", "(4, 4)", "(3, 4)")


def test_lengths_and_prefix_end_a_row_at_its_first_pad():
  tokens = np.array([[5, 6, 7, 0, 0], [5, 0, 7, 8, 0], [0, 4, 4, 4, 4], [3, 3, 3, 3, 3]])
  np.testing.assert_array_equal(masks.lengths(tokens), [3, 1, 0, 5])
  assert masks.lengths(tokens).dtype == jnp.int32
  want = np.arange(5)[None, :] < np.array([3, 1, 0, 5])[:, None]
  np.testing.assert_array_equal(masks.prefix(tokens), want)
  # padded at the end, the prefix is the padding mask
  np.testing.assert_array_equal(masks.prefix(tokens[:1]), masks.padding(tokens[:1]))
  np.testing.assert_array_equal(masks.lengths(tokens, pad_id=3), [5, 5, 5, 0])
