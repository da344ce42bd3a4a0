"""Tests for attention_jax/blockwise.py and the `blockwise` / CPU `auto` paths of `attention`."""

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import blockwise, masks


def _normal(rng, shape, dtype=jnp.float32):
  return jnp.asarray(rng.standard_normal(shape), dtype)


def _reference(q, k, v, mask=None, scale=None):
  """Float64 numpy attention with the zero-context convention for empty rows."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  s = scale * np.einsum("...qd,...kd->...qk", q, k)
  if mask is not None:
    s = np.where(mask, s, -np.inf)
  m = np.max(s, -1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0)
  p = np.exp(s - m)
  tot = p.sum(-1, keepdims=True)
  return np.einsum("...qk,...kd->...qd", p / np.where(tot > 0, tot, 1), v)


# Cases: (q shape, k shape, v shape, mask builder, tile_elements, streams).
# Small tile budgets force several heads per tile, several query blocks, padded
# query blocks (Tq not a multiple of bq) and 1-3 concurrent streams.
CASES = {
    "heads-per-tile-streams": ((2, 4, 8, 4), (2, 4, 8, 4), (2, 4, 8, 4), None, 128, 2),
    "query-blocks-padded": ((1, 2, 21, 4), (1, 2, 9, 4), (1, 2, 9, 5), None, 72, 1),
    "causal-three-streams": ((3, 2, 16, 4), (3, 2, 16, 4), (3, 2, 16, 4),
                             lambda b, h, tq, tk: masks.causal(tq), 128, 3),
    "key-padding-broadcast-kv": (
        (2, 3, 12, 4), (2, 1, 7, 4), (1, 1, 7, 6),
        lambda b, h, tq, tk: np.arange(tk)[None, None, None, :] < np.array([7, 3])[:, None, None, None],
        64, 2),
    "per-head-mask-with-empty-rows": (
        (2, 2, 10, 4), (2, 2, 6, 4), (2, 2, 6, 4),
        lambda b, h, tq, tk: np.random.default_rng(3).random((b, h, tq, tk)) < 0.3, 48, 2),
    "rank-3-no-heads": ((3, 9, 4), (3, 11, 4), (3, 11, 2), None, 40, 1),
}


def _case(name, rng):
  qs, ks, vs, mask_fn, tiles, streams = CASES[name]
  q, k, v = _normal(rng, qs), _normal(rng, ks), _normal(rng, vs)
  mask = None if mask_fn is None else jnp.asarray(mask_fn(qs[0], qs[-3] if len(qs) == 4 else 1,
                                                          qs[-2], ks[-2]))
  return q, k, v, mask, tiles, streams


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradients_match_reference(name):
  rng = np.random.default_rng(0)
  q, k, v, mask, tiles, streams = _case(name, rng)
  out_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]) + (q.shape[-2], v.shape[-1])
  cot = _normal(rng, out_shape)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * cot)

  ours = lambda q, k, v: blockwise.dot_product_attention(
      q, k, v, mask, tile_elements=tiles, streams=streams)
  plain = lambda q, k, v: aj.attention(q, k, v, mask=mask, implementation="plain")
  # One program per path: the context and the gradients of sum(context · cot).
  both = lambda fn: jax.jit(lambda q, k, v: (fn(q, k, v), jax.grad(loss(fn), (0, 1, 2))(q, k, v)))
  (out, got), (_, want) = both(ours)(q, k, v), both(plain)(q, k, v)
  assert out.shape == out_shape and out.dtype == jnp.float32
  np.testing.assert_allclose(out, _reference(q, k, v, None if mask is None else np.asarray(mask)),
                             rtol=1e-5, atol=1e-5)
  # Gradients against autodiff of the plain path (softmax + matmuls).
  for g, w, arg in zip(got, want, "qkv"):
    assert g.shape == w.shape, arg
    assert np.all(np.isfinite(g)), arg
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=arg)


def test_fully_masked_rows_give_zero_context_and_zero_gradient():
  rng = np.random.default_rng(1)
  q, k, v = _normal(rng, (2, 6, 4)), _normal(rng, (2, 5, 4)), _normal(rng, (2, 5, 4))
  mask = np.ones((2, 6, 5), bool)
  mask[0, 2] = False  # query row 2 of batch 0 may attend to nothing
  mask[1, :, 3] = False
  fn = jax.jit(lambda q: blockwise.dot_product_attention(q, k, v, jnp.asarray(mask),
                                                         tile_elements=10))
  out = fn(q)
  assert np.all(np.asarray(out[0, 2]) == 0.0)
  assert np.abs(np.asarray(out[0, 1])).max() > 0
  dq = jax.jit(jax.grad(lambda q: jnp.sum(fn(q) ** 2)))(q)
  assert np.all(np.isfinite(dq))
  assert np.all(np.asarray(dq[0, 2]) == 0.0)
  # Same convention as the plain path.
  np.testing.assert_allclose(out, aj.attention(q, k, v, mask=mask, implementation="plain"),
                             rtol=1e-5, atol=1e-6)


def test_bfloat16_close_to_float32_and_keeps_dtype():
  rng = np.random.default_rng(2)
  q, k, v = (_normal(rng, (2, 2, 32, 16)) for _ in range(3))
  mask = masks.causal(32)
  run = jax.jit(lambda q, k, v: blockwise.dot_product_attention(q, k, v, mask,
                                                                tile_elements=512))
  want = run(q, k, v)
  bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  got = run(*bf)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(run(q, k, v).astype(jnp.float32))))
  grads, want_g = grad(*bf), grad(q, k, v)
  assert grads.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(grads, np.float32), want_g, atol=5e-2)


@pytest.mark.parametrize("heads,tq,tk,budget", [
    (64, 512, 512, 2 ** 18), (64, 512, 512, 2 ** 20), (6, 100, 37, 1000),
    (7, 16384, 16384, 2 ** 18), (1, 3, 5, 2 ** 18), (12, 40, 40, 5000)])
def test_tile_shape_fits_budget_and_divides_heads(heads, tq, tk, budget):
  n, bq = blockwise.tile_shape(heads, tq, tk, budget)
  assert heads % n == 0 and 1 <= bq <= tq
  assert bq == tq or bq % 8 == 0
  # Within budget unless even 8 rows of one head exceed it.
  assert n * bq * tk <= max(budget, 8 * tk)
  if bq < tq:
    assert n == 1  # heads are grouped only when whole rows fit
  if n < heads and bq == tq:
    # The next divisor up would break the budget.
    bigger = [d for d in range(n + 1, heads + 1) if heads % d == 0]
    assert not bigger or bigger[0] * tq * tk > budget


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "cosine"])
def test_attention_blockwise_matches_plain_for_each_score(score):
  rng = np.random.default_rng(4)
  q, k, v = _normal(rng, (2, 3, 9, 8)), _normal(rng, (2, 3, 7, 8)), _normal(rng, (2, 3, 7, 8))
  params = {"w": _normal(rng, (8, 8)) / 3, "beta": jnp.asarray(rng.random((2, 3, 9, 1)) + 1)}
  mask = np.random.default_rng(5).random((2, 1, 9, 7)) < 0.7
  run = lambda impl: (lambda q, k, v: aj.attention(q, k, v, score=score, params=params,
                                                   mask=mask, implementation=impl))
  value_and_grad = lambda impl: jax.jit(jax.value_and_grad(
      lambda *a: jnp.sum(jnp.sin(run(impl)(*a))), (0, 1, 2)))
  (got, got_g), (want, want_g) = (value_and_grad(i)(q, k, v) for i in ("blockwise", "plain"))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for g, w in zip(got_g, want_g):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_attention_blockwise_rejects_what_it_cannot_compute():
  rng = np.random.default_rng(6)
  q = _normal(rng, (2, 4, 8))
  params = {"w_q": _normal(rng, (8, 3)), "w_k": _normal(rng, (8, 3)), "v": _normal(rng, (3,)),
            "beta": jnp.ones((4, 4))}
  for kwargs, fragment in (({"score": "additive"}, "'additive'"),
                           ({"return_weights": True}, "return_weights=True"),
                           ({"score": "cosine"}, "beta")):
    with pytest.raises(ValueError, match="blockwise") as info:
      aj.attention(q, q, q, params=params, implementation="blockwise", **kwargs)
    assert fragment in str(info.value)


def test_auto_on_cpu_uses_blockwise_for_long_keys_and_plain_otherwise():
  long = jax.ShapeDtypeStruct((1, 2, 8, 512, 16), jnp.float32)
  short = jax.ShapeDtypeStruct((2, 4, 511, 16), jnp.float32)
  jaxpr = lambda s, **kw: str(jax.make_jaxpr(lambda q: aj.attention(q, q, q, **kw))(s))
  assert jax.default_backend() == "cpu"
  assert "custom_vjp" in jaxpr(long)
  assert "custom_vjp" in jaxpr(long, score="dot", mask=masks.causal(512))
  # Below 512 keys: the plain path (its float32 softmax), not jax.nn's fused kernel.
  plain = jaxpr(short, implementation="plain")
  assert jaxpr(short) == plain and "custom_vjp" not in plain
  # The other scores of the dot-product family, and dv != d, take it too.
  assert "custom_vjp" in jaxpr(long, score="general", params={"w": jnp.eye(16)})
  assert "custom_vjp" in jaxpr(long, score="cosine")
  assert "custom_vjp" in str(jax.make_jaxpr(lambda q, v: aj.attention(q, q, v))(
      long, jax.ShapeDtypeStruct((1, 2, 8, 512, 5), jnp.float32)))
  # Weights requested, additive scores, or a per-key beta: plain whatever the size.
  assert "custom_vjp" not in jaxpr(long, return_weights=True)
  assert "custom_vjp" not in jaxpr(long, score="cosine", params={"beta": jnp.ones(512)})
  additive = {"w_q": jnp.ones((16, 4)), "w_k": jnp.ones((16, 4)), "v": jnp.ones(4)}
  assert "custom_vjp" not in jaxpr(long, score="additive", params=additive)


def test_vmap_and_jit_of_blockwise():
  rng = np.random.default_rng(7)
  q, k, v = (_normal(rng, (3, 2, 10, 4)) for _ in range(3))
  fn = lambda q, k, v: blockwise.dot_product_attention(q, k, v, masks.causal(10),
                                                       tile_elements=32)
  one = jax.jit(fn)
  mapped = jax.jit(jax.vmap(fn))(q, k, v)
  looped = jnp.stack([one(q[i], k[i], v[i]) for i in range(3)])
  np.testing.assert_allclose(mapped, looped, rtol=1e-5, atol=1e-6)
  grad = jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) ** 2))
  g_mapped = jax.jit(jax.vmap(grad))(q, k, v)
  one_grad = jax.jit(grad)
  g_looped = jnp.stack([one_grad(q[i], k[i], v[i]) for i in range(3)])
  np.testing.assert_allclose(g_mapped, g_looped, rtol=1e-4, atol=1e-5)


def test_bad_input_is_named(raises_at_trace):
  z = lambda *s: np.zeros(s, np.float32)
  f = blockwise.dot_product_attention
  raises_at_trace(f, (z(2, 5, 3), z(2, 6, 4), z(2, 6, 4)), ValueError, "`query`", "`keys`")
  raises_at_trace(f, (z(2, 5, 4), z(2, 6, 4), z(2, 7, 4)), ValueError, "values (Tk axis)")
  raises_at_trace(f, (z(2, 5, 4), z(3, 6, 4), z(3, 6, 4)), ValueError, "leading axes")
  raises_at_trace(lambda q, k, v, m: f(q, k, v, m),
                  (z(2, 5, 4), z(2, 6, 4), z(2, 6, 4), z(5, 6)), TypeError, "`mask`")
  raises_at_trace(lambda q, k, v, m: f(q, k, v, m),
                  (z(2, 5, 4), z(2, 6, 4), z(2, 6, 4), np.ones((3, 5, 6), bool)),
                  ValueError, "`mask`", "(3, 5, 6)")
  raises_at_trace(lambda q: f(q, q, q, tile_elements=0), (z(2, 5, 4),), ValueError,
                  "`tile_elements`")
  raises_at_trace(lambda q: f(q, q, q, streams=1.5), (z(2, 5, 4),), TypeError, "`streams`")
  raises_at_trace(lambda q: f(q, q, q), (np.zeros((2, 5, 4), np.int32),), TypeError,
                  "floating")


# --- the fused (jax.nn) path's mask handling and cuDNN choice, edited alongside ---


@pytest.mark.parametrize("lead,mask_shape", [
    ((2, 3), (5, 6)),  # causal-like [Tq, Tk]
    ((2, 3), (2, 1, 1, 6)),  # key padding
    ((2, 3), (2, 3, 5, 6)),  # full
    ((4, 2, 3), (2, 1, 5, 1)),  # several batch axes, mask constant over keys
    ((3,), (3, 5, 6)),  # no head axis
    ((), (5, 6)),  # unbatched
])
def test_fused_path_with_broadcast_masks_matches_plain(lead, mask_shape):
  rng = np.random.default_rng(8)
  q, k, v = _normal(rng, lead + (5, 8)), _normal(rng, lead + (6, 8)), _normal(rng, lead + (6, 8))
  mask = jnp.asarray(rng.random(mask_shape) < 0.6)
  run = jax.jit(lambda q, k, v, impl: aj.attention(q, k, v, mask=mask, implementation=impl),
                static_argnums=3)
  np.testing.assert_allclose(run(q, k, v, "xla"), run(q, k, v, "plain"), rtol=1e-5, atol=1e-5)


def test_cudnn_is_chosen_only_where_its_flash_kernel_applies(monkeypatch):
  # The package exports the function `attention`, which hides the module of that name.
  attention_lib = importlib.import_module("attention_jax.attention")
  q = lambda d, dtype: jnp.zeros((1, 4, 2, d), dtype)
  assert not attention_lib._cudnn_applies(q(64, jnp.bfloat16), None)  # this is a CPU
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert attention_lib._cudnn_applies(q(64, jnp.bfloat16), None)
  assert attention_lib._cudnn_applies(q(128, jnp.float16), None)
  assert not attention_lib._cudnn_applies(q(64, jnp.float32), None)
  assert not attention_lib._cudnn_applies(q(160, jnp.bfloat16), None)
  assert not attention_lib._cudnn_applies(q(60, jnp.bfloat16), None)
  assert not attention_lib._cudnn_applies(q(64, jnp.bfloat16), jnp.ones((1, 1, 4, 4), bool))
