"""Tests for attention_jax.positional: sinusoidal table and learned lookup.

Shape glossary: T length (positions), D feature size, P max table length.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import positional


def ref_sinusoidal(length, dim):
  """PE(pos, 2i) = sin(pos / 10000^(2i/dim)), PE(pos, 2i+1) = cos(same), one entry at a time."""
  table = np.zeros((length, dim))
  for pos in range(length):
    for i in range((dim + 1) // 2):
      angle = pos / 10000 ** (2 * i / dim)
      table[pos, 2 * i] = math.sin(angle)
      if 2 * i + 1 < dim:
        table[pos, 2 * i + 1] = math.cos(angle)
  return table


@pytest.mark.parametrize("length,dim", [(1, 1), (7, 1), (9, 2), (11, 7), (50, 16), (3, 33)])
def test_sinusoidal_matches_formula(length, dim):
  table = positional.sinusoidal(length, dim)
  assert table.shape == (length, dim) and table.dtype == jnp.float32
  np.testing.assert_allclose(table, ref_sinusoidal(length, dim), rtol=0, atol=1e-6)


def test_sinusoidal_odd_dim_ends_with_a_sine_column():
  # With an odd dim the frequencies follow dim itself; the last column is a sine.
  table = np.asarray(positional.sinusoidal(20, 5))
  assert np.all(table[0, 0::2] == 0.0) and np.all(table[0, 1::2] == 1.0)
  np.testing.assert_allclose(table[:, 4], np.sin(np.arange(20) / 10000 ** (4 / 5)), atol=1e-6)


def _rotation(offset, dim):
  """Block-diagonal map M_k with PE[pos + k] = M_k @ PE[pos], built from the formula only.

  On each (sin a, cos a) pair, shifting the angle by b = k·ω_i is the rotation
  [[cos b, sin b], [-sin b, cos b]]; it does not depend on pos.
  """
  m = np.zeros((dim, dim))
  for i in range(dim // 2):
    b = offset / 10000 ** (2 * i / dim)
    m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[math.cos(b), math.sin(b)],
                                           [-math.sin(b), math.cos(b)]]
  return m


@pytest.mark.parametrize("dim", [2, 8, 64])
@pytest.mark.parametrize("offset", [1, 3, 17])
def test_shift_by_k_is_a_fixed_rotation(dim, offset):
  length = 40
  table = np.asarray(positional.sinusoidal(length + offset, dim), np.float64)  # [T + k, D]
  m = _rotation(offset, dim)
  np.testing.assert_allclose(m @ m.T, np.eye(dim), atol=1e-12)  # orthogonal
  # One matrix for every position: PE[pos + k] = M_k PE[pos].
  np.testing.assert_allclose(table[offset:], table[:length] @ m.T, atol=2e-5)
  # Norm is position independent (each pair has sin² + cos² = 1).
  np.testing.assert_allclose(np.linalg.norm(table, axis=-1), math.sqrt(dim / 2), rtol=1e-5)


def test_shift_rotation_holds_on_the_pairs_of_an_odd_dim():
  table = np.asarray(positional.sinusoidal(30, 9), np.float64)
  m = _rotation(4, 9)[:8, :8]  # the four complete (sin, cos) pairs
  np.testing.assert_allclose(table[4:, :8], table[:26, :8] @ m.T, atol=2e-5)


def test_sinusoidal_under_jit_is_a_constant_equal_to_eager():
  x = jnp.ones((6, 5))
  add = jax.jit(lambda x: x + positional.sinusoidal(6, 5))
  np.testing.assert_allclose(add(x), x + positional.sinusoidal(6, 5), rtol=0, atol=0)
  # vmap over a batch of embeddings adds the same table to each; the gradient
  # with respect to the embeddings passes straight through.
  xs = jnp.asarray(np.random.default_rng(0).normal(size=(3, 6, 5)), jnp.float32)
  np.testing.assert_allclose(jax.vmap(add)(xs), jnp.stack([add(x) for x in xs]), atol=0)
  g = jax.grad(lambda x: jnp.sum(jnp.sin(add(x))))(x)
  np.testing.assert_allclose(g, jnp.cos(add(x)), rtol=1e-6)


def test_learned_reads_rows_offset_to_offset_plus_length():
  table = jnp.arange(24.0).reshape(8, 3)  # [P, D]
  np.testing.assert_array_equal(positional.learned(table, 3), table[:3])
  np.testing.assert_array_equal(positional.learned(table, 3, 5), table[5:8])
  np.testing.assert_array_equal(positional.learned(table, 8), table)


def test_learned_jit_vmap_grad():
  rng = np.random.default_rng(1)
  table = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
  lookup = jax.jit(lambda t, o: positional.learned(t, 3, o))  # offset traced
  for offset in range(6):
    np.testing.assert_array_equal(lookup(table, offset), table[offset:offset + 3])
  offsets = jnp.array([0, 2, 5])
  mapped = jax.vmap(lookup, in_axes=(None, 0))(table, offsets)
  np.testing.assert_array_equal(mapped, jnp.stack([table[o:o + 3] for o in [0, 2, 5]]))
  # d/d table of the sum of rows 2..4: ones on exactly those rows.
  g = jax.grad(lambda t: jnp.sum(lookup(t, 2)))(table)
  assert np.all(np.isfinite(g))
  np.testing.assert_array_equal(g, np.r_[np.zeros((2, 3)), np.ones((3, 3)), np.zeros((3, 3))])


# --- Bad input -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["length", "dim"])
@pytest.mark.parametrize("value", [0, -1])
def test_sinusoidal_rejects_non_positive_sizes(name, value):
  kwargs = {"length": 4, "dim": 6, name: value}
  with pytest.raises(ValueError, match=f"`{name}` must be > 0, got {value}"):
    positional.sinusoidal(**kwargs)


@pytest.mark.parametrize("name", ["length", "dim"])
@pytest.mark.parametrize("value", [4.0, "4", True, None, np.float64(4)])
def test_sinusoidal_rejects_non_int_sizes(name, value):
  kwargs = {"length": 4, "dim": 6, name: value}
  with pytest.raises(TypeError, match=f"`{name}` must be a Python int"):
    positional.sinusoidal(**kwargs)


def test_sinusoidal_rejects_traced_dim_at_trace_time():
  with pytest.raises(TypeError, match="`dim`"):
    jax.jit(lambda d: positional.sinusoidal(4, d))(6)


def test_learned_rejects_bad_arguments(raises_at_trace):
  table = np.zeros((8, 3), np.float32)
  raises_at_trace(lambda t: positional.learned(t, 9), (table,), ValueError,
                  "`length` 9", "max_len 8")
  raises_at_trace(lambda t: positional.learned(t, 3), (np.zeros(8, np.float32),),
                  ValueError, "`table`", "(8,)")
  raises_at_trace(lambda t: positional.learned(t, 3, 6), (table,), ValueError, "`offset` 6")
  raises_at_trace(lambda t: positional.learned(t, 3, -1), (table,), ValueError, "`offset` -1")
  raises_at_trace(lambda t: positional.learned(t, 0), (table,), ValueError, "`length`")


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "10000"])
def test_sinusoidal_rejects_a_bad_max_timescale(bad):
  with pytest.raises(ValueError, match="max_timescale"):
    positional.sinusoidal(4, 4, max_timescale=bad)
