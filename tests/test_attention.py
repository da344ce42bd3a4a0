"""Tests for `attend`, `attention` and `compute_scores`.

Shape glossary: B batch, H heads, T / Tq / Tk lengths, d features, dv value size.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import masks, positional, registry, scores

# The module (the package attribute `attention` is the function).
attention_lib = importlib.import_module("attention_jax.attention")

# Implementations that run on CPU ('cudnn' needs a GPU).
CPU_IMPLEMENTATIONS = ("plain", "xla", "auto")


def _normal(rng, shape, dtype=jnp.float32):
  return jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype)


def ref_attend(scores_, values, mask=None):
  """Masked softmax over keys in float64; rows with no valid key get zeros."""
  s = np.asarray(scores_, np.float64)
  v = np.asarray(values, np.float64)
  m = np.ones(s.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), s.shape)
  weights = np.zeros(s.shape)
  for row in np.ndindex(*s.shape[:-1]):
    valid = m[row]
    if valid.any():
      e = np.exp(s[row][valid] - s[row][valid].max())
      weights[row][valid] = e / e.sum()
  return np.matmul(weights, v), weights


def _params(rng, d, a=5):
  """Weights for every score name (shared by all of them)."""
  return {"w": _normal(rng, (d, d)) / np.sqrt(d),
          "w_q": _normal(rng, (d, a)) / np.sqrt(d),
          "w_k": _normal(rng, (d, a)) / np.sqrt(d),
          "v": _normal(rng, (a,)),
          "beta": jnp.asarray(2.0)}


def _random_mask(rng, shape, p=0.6, full_rows=1):
  """Random bool mask with at least `full_rows` fully masked query rows."""
  mask = rng.random(shape) < p
  mask[..., :full_rows, :] = False
  return mask


# --- attend ---------------------------------------------------------------------


def test_attend_matches_numpy_reference():
  rng = np.random.default_rng(0)
  s = _normal(rng, (2, 3, 4, 5))  # [B, H, Tq, Tk]
  v = _normal(rng, (2, 3, 5, 6))  # [B, H, Tk, dv]
  mask = _random_mask(rng, (2, 1, 4, 5))  # broadcast over heads
  for m in (None, mask):
    context, weights = aj.attend(s, v, m)
    want_context, want_weights = ref_attend(s, v, m)
    assert context.shape == (2, 3, 4, 6) and weights.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, want_context, rtol=1e-5, atol=1e-5)


def test_attend_row_sums_masked_keys_and_fully_masked_rows():
  rng = np.random.default_rng(1)
  s = 5.0 * _normal(rng, (2, 6, 7))  # [B, Tq, Tk]
  v = _normal(rng, (2, 7, 3))  # [B, Tk, dv]
  mask = _random_mask(rng, (2, 6, 7), p=0.4)
  mask[1, 3] = False  # a second fully masked row
  mask[1, 4] = False
  mask[1, 4, 6] = True  # a row with exactly one valid key
  context, weights = aj.attend(s, v, mask)
  weights, context = np.asarray(weights), np.asarray(context)
  any_valid = mask.any(-1)
  assert (~any_valid).sum() >= 3
  np.testing.assert_allclose(weights.sum(-1)[any_valid], 1.0, rtol=1e-6)
  assert np.all(weights[~mask] == 0.0)  # exactly zero, not merely small
  assert np.all(weights[~any_valid] == 0.0)
  assert np.all(context[~any_valid] == 0.0)
  assert weights[1, 4, 6] == 1.0
  np.testing.assert_allclose(context[1, 4], v[1, 6], rtol=1e-6)


def test_fully_masked_rows_have_finite_zero_gradients():
  rng = np.random.default_rng(2)
  s, v = _normal(rng, (3, 4)), _normal(rng, (4, 2))
  mask = np.array([[True, False, True, True], [False] * 4, [False, True, False, False]])

  def loss(s, v):
    context, weights = aj.attend(s, v, mask)
    return jnp.sum(context ** 2) + jnp.sum(jnp.sin(weights))

  g_s, g_v = jax.grad(loss, argnums=(0, 1))(s, v)
  assert np.all(np.isfinite(g_s)) and np.all(np.isfinite(g_v))
  assert np.all(np.asarray(g_s)[~mask] == 0.0)  # no signal reaches masked scores
  # Every-key-masked input: the whole output and every gradient are zeros.
  none = np.zeros((3, 4), bool)
  g_s, g_v = jax.grad(lambda s, v: jnp.sum(aj.attend(s, v, none)[0]), argnums=(0, 1))(s, v)
  assert np.all(np.asarray(g_s) == 0.0) and np.all(np.asarray(g_v) == 0.0)


def test_masked_rows_stay_finite_for_extreme_scores():
  s = jnp.array([[1e30, -1e30, 3e38], [-3e38, -3e38, -3e38]], jnp.float32)
  v = jnp.ones((3, 2))
  mask = np.array([[True, True, False], [True, True, True]])
  context, weights = aj.attend(s, v, mask)
  assert np.all(np.isfinite(context)) and np.all(np.isfinite(weights))
  np.testing.assert_allclose(weights, [[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)


def test_causal_and_padding_mask_behaves_like_both():
  rng = np.random.default_rng(3)
  tokens = np.array([[4, 9, 2, 0, 0], [7, 0, 3, 8, 0]])  # 0 = padding (also mid-sequence)
  s = _normal(rng, (2, 3, 5, 5))  # [B, H, T, T]
  v = _normal(rng, (2, 3, 5, 4))  # [B, H, T, dv]
  mask = masks.combine(masks.causal(5), masks.padding(tokens)[:, None, None, :])
  context, weights = aj.attend(s, v, mask)
  # Reference: key j is visible to query i iff j <= i and token j is real.
  allowed = np.zeros((2, 1, 5, 5), bool)
  for b in range(2):
    for i in range(5):
      for j in range(5):
        allowed[b, 0, i, j] = j <= i and tokens[b, j] != 0
  want_context, want_weights = ref_attend(s, v, allowed)
  np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(context, want_context, rtol=1e-5, atol=1e-5)
  # Each mask alone lets through a strict superset of what the combination does.
  only_causal = np.asarray(aj.attend(s, v, masks.causal(5))[1])
  only_padding = np.asarray(aj.attend(s, v, masks.padding(tokens)[:, None, None, :])[1])
  assert np.all(np.asarray(weights)[only_causal == 0] == 0)
  assert np.all(np.asarray(weights)[only_padding == 0] == 0)


def test_bf16_attend_softmax_in_float32_and_close_to_float32():
  rng = np.random.default_rng(4)
  s32, v32 = 3.0 * _normal(rng, (2, 6, 7)), _normal(rng, (2, 7, 8))
  s16, v16 = s32.astype(jnp.bfloat16), v32.astype(jnp.bfloat16)
  mask = _random_mask(rng, (2, 6, 7))
  context, weights = aj.attend(s16, v16, mask)
  assert weights.dtype == jnp.float32 and context.dtype == jnp.bfloat16
  # float32 softmax of the (bf16-valued) scores: far tighter than bf16's 2**-8.
  _, want_weights = ref_attend(s16.astype(jnp.float32), v32, mask)
  np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
  context32, weights32 = aj.attend(s32, v32, mask)
  np.testing.assert_allclose(np.asarray(context, np.float32), context32, atol=5e-2)
  np.testing.assert_allclose(weights, weights32, atol=3e-2)
  assert np.all(np.asarray(context, np.float32)[~mask.any(-1)] == 0.0)


def test_attend_broadcasts_values_over_heads():
  rng = np.random.default_rng(5)
  s, v = _normal(rng, (2, 3, 4, 5)), _normal(rng, (2, 1, 5, 6))  # values shared by heads
  context, _ = aj.attend(s, v)
  np.testing.assert_allclose(context, ref_attend(s, np.broadcast_to(v, (2, 3, 5, 6)))[0],
                             rtol=1e-5, atol=1e-5)


# --- causality and permutation equivariance -----------------------------------


# The fused kernel ('xla') only has dot-product scores; 'auto' falls back to plain.
@pytest.mark.parametrize("score,implementation", [
    (score, impl) for score in registry.FUNCTION_SCORES for impl in CPU_IMPLEMENTATIONS
    if impl != "xla" or score in ("dot", "scaled_dot")])
def test_causality_by_gradient(score, implementation):
  rng = np.random.default_rng(6)
  t, d = 6, 4
  x = _normal(rng, (t, d))  # [T, d] one sequence, self-attention
  params = _params(rng, d)
  fn = lambda x: aj.attention(x, x, x, score=score, params=params, mask=masks.causal(t),
                              implementation=implementation)
  jac = np.asarray(jax.jit(jax.jacrev(fn))(x))  # [T, d, T, d]: d out[i] / d x[j]
  assert np.all(np.isfinite(jac))
  for i in range(t):
    for j in range(t):
      block = np.abs(jac[i, :, j, :]).max()
      if j > i:
        assert block == 0.0, (i, j, block)
      elif j == i:
        assert block > 0.0, (i, j)  # the output does depend on the past / present


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "additive", "cosine"])
def test_self_attention_is_permutation_equivariant_without_positions(score):
  rng = np.random.default_rng(7)
  t, d = 7, 8
  x = _normal(rng, (2, t, d))  # [B, T, d]
  params = _params(rng, d)
  perm = rng.permutation(t)
  while np.all(perm == np.arange(t)):
    perm = rng.permutation(t)
  attn = lambda x: aj.attention(x, x, x, score=score, params=params, implementation="plain")
  np.testing.assert_allclose(attn(x[:, perm]), attn(x)[:, perm], rtol=1e-5, atol=1e-5)
  # Adding the sinusoidal table pins each row to its position: equivariance breaks.
  pe = positional.sinusoidal(t, d)  # [T, d]
  with_pe = lambda x: attn(x + pe)
  gap = np.abs(np.asarray(with_pe(x[:, perm])) - np.asarray(with_pe(x)[:, perm])).max()
  assert gap > 1e-2, gap


# --- attention: implementations agree -------------------------------------------


def _layouts():
  """(query shape, key shape, value-shape, mask builder) cases for the fused path."""
  rng = np.random.default_rng(8)
  pad = lambda b, t: np.arange(t)[None, :] < np.array([t, 2, 0][:b])[:, None]  # [B, T]
  return [
      ((5, 4), (5, 4), None),
      ((5, 4), (5, 4), lambda: masks.causal(5)),
      ((2, 5, 4), (2, 6, 4), lambda: _random_mask(rng, (2, 5, 6))),
      ((2, 3, 5, 4), (2, 3, 5, 4), lambda: masks.combine(
          masks.causal(5), masks.cross(pad(2, 5), pad(2, 5)))),
      ((3, 2, 4, 4), (3, 2, 6, 4), lambda: masks.cross(pad(3, 4), pad(3, 6))),
      ((2, 2, 3, 4, 4), (2, 2, 3, 6, 4), lambda: _random_mask(rng, (2, 1, 3, 4, 6))),
      ((2, 3, 5, 4), (2, 3, 5, 4), lambda: np.zeros((5, 5), bool)),  # everything masked
  ]


@functools.partial(jax.jit, static_argnames=("score", "implementation"))
def _attention_vjp(q, k, v, mask, cotangent, *, score, implementation):
  """Output and (q, k, v) cotangents, compiled once per layout and path."""
  fn = lambda q, k, v: aj.attention(q, k, v, score=score, mask=mask,
                                    implementation=implementation)
  out, vjp = jax.vjp(fn, q, k, v)
  return out, vjp(cotangent)


@pytest.mark.parametrize("score", ["dot", "scaled_dot"])
@pytest.mark.parametrize("case", range(7))
def test_fused_implementations_match_plain(case, score):
  q_shape, k_shape, make_mask = _layouts()[case]
  rng = np.random.default_rng(9 + case)
  q, k, v = _normal(rng, q_shape), _normal(rng, k_shape), _normal(rng, k_shape)
  mask = None if make_mask is None else make_mask()
  cotangent = _normal(rng, q_shape)

  want, want_grads = _attention_vjp(q, k, v, mask, cotangent, score=score,
                                    implementation="plain")
  for implementation in ("xla", "auto"):
    out, grads = _attention_vjp(q, k, v, mask, cotangent, score=score,
                                implementation=implementation)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=implementation)
    if mask is not None:  # rows with no valid key: zero context on every path
      scores_shape = want.shape[:-1] + (k_shape[-2],)  # [..., Tq, Tk]
      no_key = ~np.broadcast_to(mask, scores_shape).any(-1)  # [..., Tq]
      np.testing.assert_array_equal(np.asarray(out)[no_key], 0.0)
    for name, g, w in zip("qkv", grads, want_grads):
      assert np.all(np.isfinite(g)), (implementation, name)
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{implementation} {name}")


@pytest.mark.parametrize("implementation", ["xla", "auto"])
def test_fused_bf16_close_to_plain(implementation):
  rng = np.random.default_rng(20)
  q, k, v = (_normal(rng, (2, 2, 5, 8), jnp.bfloat16) for _ in range(3))
  mask = masks.causal(5)
  run = jax.jit(aj.attention, static_argnames="implementation")
  out = run(q, k, v, mask=mask, implementation=implementation)
  want = run(q, k, v, mask=mask, implementation="plain")
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32),
                             atol=3e-2)


def test_auto_falls_back_to_plain_when_fused_does_not_apply():
  rng = np.random.default_rng(21)
  q, k, v = _normal(rng, (2, 5, 4)), _normal(rng, (2, 6, 4)), _normal(rng, (2, 6, 3))  # dv != d
  params = _params(rng, 4)
  for score in registry.FUNCTION_SCORES:
    want = aj.attend(aj.compute_scores(score, q, k, params), v)[0]
    np.testing.assert_allclose(aj.attention(q, k, v, score=score, params=params), want,
                               rtol=1e-6, atol=1e-6)
  # return_weights always takes the plain path and returns float32 weights.
  context, weights = aj.attention(q, k, k, return_weights=True)
  assert weights.dtype == jnp.float32 and weights.shape == (2, 5, 6)
  np.testing.assert_allclose(context, aj.attention(q, k, k, implementation="xla"),
                             rtol=1e-5, atol=1e-5)


def test_compute_scores_dispatches_by_name():
  rng = np.random.default_rng(22)
  q, k = _normal(rng, (3, 4)), _normal(rng, (5, 4))
  p = _params(rng, 4)
  expected = {"dot": scores.dot(q, k), "scaled_dot": scores.scaled_dot(q, k),
              "general": scores.general(q, k, p["w"]),
              "additive": scores.additive(q, k, p["w_q"], p["w_k"], p["v"]),
              "cosine": scores.cosine(q, k, p["beta"])}
  for name, want in expected.items():
    np.testing.assert_allclose(aj.compute_scores(name, q, k, p), want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(aj.compute_scores("cosine", q, k), scores.cosine(q, k), rtol=1e-6)
  # general with W = I is the dot score.
  np.testing.assert_allclose(aj.compute_scores("general", q, k, {"w": jnp.eye(4)}),
                             scores.dot(q, k), rtol=1e-6, atol=1e-6)


# --- jit / vmap / grad ---------------------------------------------------------

FUNCTIONS = [("attend", None), ("compute_scores", None)] + [
    (f"attention-{impl}-{score}", (impl, score))
    for impl in CPU_IMPLEMENTATIONS for score in registry.FUNCTION_SCORES
    if impl == "plain" or score in ("dot", "scaled_dot")]


def _function(which, rng, batch=None):
  """(fn of float arrays, args); a leading batch axis when `batch` is given."""
  lead = () if batch is None else (batch,)
  q, k, v = _normal(rng, lead + (4, 6)), _normal(rng, lead + (5, 6)), _normal(rng, lead + (5, 6))
  mask = _random_mask(rng, (4, 5), full_rows=1)
  params = _params(rng, 6)
  name, spec = which
  if name == "attend":
    return lambda s, v: aj.attend(s, v, mask), (_normal(rng, lead + (4, 5)), v)
  if name == "compute_scores":
    return lambda q, k, p: aj.compute_scores("additive", q, k, p), (q, k, params)
  impl, score = spec
  return (lambda q, k, v, p: aj.attention(q, k, v, score=score, params=p, mask=mask,
                                          implementation=impl), (q, k, v, params))


def _sum_outputs(out):
  return sum(jnp.sum(jnp.sin(x.astype(jnp.float32))) for x in jax.tree.leaves(out))


@pytest.mark.parametrize("which", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_jit_vmap_grad(which):
  rng = np.random.default_rng(23)
  fn, args = _function(which, rng)
  eager = fn(*args)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               jax.jit(fn)(*args), eager)
  grads = jax.jit(jax.grad(lambda *a: _sum_outputs(fn(*a)), argnums=range(len(args))))(*args)
  for g in jax.tree.leaves(grads):
    assert np.all(np.isfinite(g))
  assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))
  # vmap over a batch axis of the array arguments (params dicts are shared).
  fn, batched = _function(which, np.random.default_rng(24), batch=3)
  in_axes = tuple(None if isinstance(a, dict) else 0 for a in batched)
  mapped = jax.vmap(fn, in_axes=in_axes)(*batched)
  looped = [fn(*(a if ax is None else a[i] for a, ax in zip(batched, in_axes)))
            for i in range(3)]
  looped = jax.tree.map(lambda *xs: jnp.stack(xs), *looped)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               mapped, looped)


# --- Bad input -----------------------------------------------------------------


def test_attend_rejects_bad_masks(raises_at_trace):
  s, v = np.zeros((2, 4, 5), np.float32), np.zeros((2, 5, 3), np.float32)
  raises_at_trace(aj.attend, (s, v, np.ones((2, 4, 6), bool)), ValueError,
                  "`mask`", "(2, 4, 6)", "(2, 4, 5)")
  # A mask with more axes than the scores would silently enlarge the output.
  raises_at_trace(aj.attend, (s, v, np.ones((3, 2, 4, 5), bool)), ValueError,
                  "`mask`", "(3, 2, 4, 5)", "(2, 4, 5)")
  raises_at_trace(aj.attend, (s, v, np.ones((2, 4, 5), np.float32)), TypeError,
                  "`mask`", "boolean", "float32")
  raises_at_trace(aj.attend, (s, v, np.ones((2, 4, 5), np.int32)), TypeError, "`mask`", "int32")


def test_attend_rejects_bad_values(raises_at_trace):
  s = np.zeros((2, 4, 5), np.float32)
  raises_at_trace(aj.attend, (s, np.zeros((2, 6, 3), np.float32)), ValueError,
                  "values (Tk axis)", "(2, 6, 3)", "(2, 4, 5)")
  raises_at_trace(aj.attend, (s, np.zeros((3, 5, 3), np.float32)), ValueError,
                  "values (leading axes)", "(3,)")
  raises_at_trace(aj.attend, (np.zeros(5, np.float32), np.zeros((5, 3), np.float32)),
                  ValueError, "`scores`", "(5,)")


@pytest.mark.parametrize("implementation", CPU_IMPLEMENTATIONS)
def test_attention_rejects_bad_shapes(implementation, raises_at_trace):
  z = lambda *s: np.zeros(s, np.float32)

  def call(mask=None, **kw):
    return lambda q, k, v: aj.attention(q, k, v, mask=mask, implementation=implementation,
                                        **kw)

  if implementation != "xla":
    raises_at_trace(call(), (z(2, 5, 3), z(2, 6, 4), z(2, 6, 4)), ValueError,
                    "`q`", "`k`", "(2, 5, 3)", "(2, 6, 4)")
  raises_at_trace(call(), (z(2, 5, 4), z(2, 6, 4), z(2, 7, 4)), ValueError,
                  "values (Tk axis)", "(2, 7, 4)")
  raises_at_trace(call(), (z(2, 5, 4), z(2, 6, 4), z(3, 6, 4)), ValueError,
                  "values (leading axes)", "(3,)")
  raises_at_trace(call(), (z(5, 4), z(6, 4), z(4)), ValueError, "`values`", "(4,)")
  raises_at_trace(call(np.ones((5, 5), bool)), (z(2, 5, 4), z(2, 6, 4), z(2, 6, 4)),
                  ValueError, "`mask`", "(5, 5)", "(2, 5, 6)")
  raises_at_trace(call(np.ones((5, 6), np.float32)), (z(2, 5, 4), z(2, 6, 4), z(2, 6, 4)),
                  TypeError, "`mask`", "float32")


def test_attention_rejects_bad_options(raises_at_trace):
  q = np.zeros((5, 4), np.float32)
  args = (q, q, q)
  raises_at_trace(lambda q, k, v: aj.attention(q, k, v, implementation="flash"), args,
                  ValueError, "`implementation`", "'flash'", "plain")
  raises_at_trace(lambda q, k, v: aj.attention(q, k, v, score="bilinear"), args,
                  ValueError, "`score`", "'bilinear'", "scaled_dot")
  raises_at_trace(lambda q, k, v: aj.attention(q, k, v, score="general"), args,
                  ValueError, "`params`", "'w'")
  raises_at_trace(lambda q, k, v: aj.attention(q, k, v, score="additive", params={"w_q": q}),
                  args, ValueError, "`params`", "'w_k'", "'v'")
  raises_at_trace(lambda q, k, v: aj.attention(q, k, v, score="general", params={"w": q[:4]},
                                               implementation="xla"), args,
                  ValueError, "implementation='xla'", "score='general'")
  raises_at_trace(lambda q, k, v: aj.attention(q, k, v[:, :3], implementation="xla"), args,
                  ValueError, "implementation='xla'", "v (5, 3)")


def test_integer_inputs_give_the_float_result():
  # int32 inputs used to truncate the scale and the weights to 0
  q, k, v = jnp.ones((1, 2, 4), jnp.int32), jnp.ones((1, 3, 4), jnp.int32), jnp.full(
      (1, 3, 4), 7, jnp.int32)
  for implementation in ("plain", "xla", "blockwise", "auto"):
    out = aj.attention(q, k, v, implementation=implementation)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), 7.0, rtol=1e-6, err_msg=implementation)
  context, weights = aj.attend(jnp.ones((2, 3), jnp.int32), jnp.full((3, 2), 7, jnp.int32))
  np.testing.assert_allclose(np.asarray(weights), 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(context), 7.0, rtol=1e-6)


@pytest.mark.parametrize("tk", [16, 600])  # below and above auto's blockwise switch on CPU
def test_float16_scores_beyond_its_range_are_finite_on_every_path(tk):
  # q·k = 8 · 120 · 100 = 96,000 > float16 max 65,504
  q = jnp.full((1, 4, 8), 120.0, jnp.float16)
  k = jnp.full((1, tk, 8), 100.0, jnp.float16)
  v = jnp.asarray(np.random.default_rng(0).normal(size=(1, tk, 8)), jnp.float16)
  want = np.asarray(v, np.float32).mean(axis=1)  # equal scores: uniform weights
  for implementation in ("plain", "xla", "blockwise", "auto"):
    out = np.asarray(aj.attention(q, k, v, score="dot", implementation=implementation),
                     np.float32)
    assert np.all(np.isfinite(out)), implementation
    np.testing.assert_allclose(out[0], np.broadcast_to(want, (4, 8)), atol=2e-3,
                               err_msg=implementation)


@pytest.mark.parametrize("implementation", ["plain", "xla", "blockwise", "auto"])
def test_empty_axes_are_named_errors_at_trace_time(implementation, raises_at_trace):
  run = functools.partial(aj.attention, implementation=implementation)
  raises_at_trace(run, [np.ones((2, 0)), np.ones((3, 0)), np.ones((3, 0))], ValueError,
                  "`query`", "empty feature axis", "(2, 0)")
  raises_at_trace(run, [np.ones((2, 4)), np.ones((0, 4)), np.ones((0, 4))], ValueError,
                  "`keys`", "empty key (Tk) axis", "(0, 4)")
  raises_at_trace(lambda s, v: aj.attend(s, v, jnp.ones((2, 0), bool)),
                  [np.ones((2, 0)), np.ones((0, 4))], ValueError, "`scores`", "(2, 0)")


@pytest.mark.parametrize("score,impl,tk,weights,expected", [
    ("scaled_dot", "auto", 64, False, "plain"),  # CPU: plain below _BLOCKWISE_MIN_KEYS
    ("scaled_dot", "auto", 512, False, "blockwise"),
    ("general", "auto", 512, False, "blockwise"),
    ("additive", "auto", 512, False, "plain"),  # no blockwise form
    ("scaled_dot", "auto", 512, True, "plain"),  # weights asked
    ("dot", "xla", 64, False, "fused"),
    ("cosine", "blockwise", 64, False, "blockwise"),
    ("dot", "plain", 1024, False, "plain"),
])
def test_select_implementation_is_the_one_switch(score, impl, tk, weights, expected):
  if jax.default_backend() != "cpu" and impl == "auto":
    pytest.skip("the CPU rules of `auto`")
  q, k = jnp.ones((2, 3, 8)), jnp.ones((2, tk, 8))
  assert attention_lib.select_implementation(score, impl, q, k, k,
                                             return_weights=weights) == expected


@pytest.mark.parametrize("score,impl,match", [
    ("additive", "xla", "supports score 'dot'/'scaled_dot'"),
    ("additive", "blockwise", "supports scores 'dot', 'scaled_dot', 'general'"),
    ("dot", "flash", "`implementation` must be one of"),
])
def test_select_implementation_refuses_what_cannot_serve(score, impl, match):
  q = jnp.ones((2, 3, 8))
  with pytest.raises(ValueError, match=match):
    attention_lib.select_implementation(score, impl, q, q, q)


def test_every_kernel_refuses_a_mask_that_would_enlarge_the_scores_in_one_line():
  """`attend`, the blockwise kernel and the Pallas additive kernels check a
  mask the same way (`_validate.mask_within`): boolean, and broadcasting to
  the scores without enlarging them."""
  from attention_jax import _validate  # pylint: disable=import-outside-toplevel
  from attention_jax import blockwise  # pylint: disable=import-outside-toplevel
  from attention_jax import pallas_additive  # pylint: disable=import-outside-toplevel
  q = jnp.ones((2, 3, 4))
  wider = jnp.ones((2, 2, 3, 3), bool)  # an extra axis: [2, 2, 3, 3] > scores [2, 3, 3]
  said = r"`mask` \(2, 2, 3, 3\) must broadcast to the scores shape \(2, 3, 3\) without enlarging it"
  for call in (lambda: attention_lib.attend(jnp.ones((2, 3, 3)), q, wider),
               lambda: blockwise.dot_product_attention(q, q, q, wider),
               lambda: pallas_additive.additive_attention_projected(q, q, q, jnp.ones(4), wider)):
    with pytest.raises(ValueError, match=said):
      call()
  with pytest.raises(TypeError, match="`mask` must be a boolean array"):
    _validate.mask_within(jnp.ones((3, 3)), (2, 3, 3))
  assert _validate.mask_within(None, (2, 3, 3)) is None
  assert _validate.mask_within(np.ones((3, 1), bool), (2, 3, 3)).shape == (3, 1)
