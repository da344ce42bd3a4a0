"""attention_jax/pallas_additive.py: the fused additive kernels in Pallas's
interpret mode (CPU), against the plain form (`attention(implementation='plain')`,
i.e. `scores.additive` + `attend`) and its `jax.grad`.

Shapes are small but cut into several query blocks, key blocks and chunks of
`a` (tiles 8 x 8 x 8), with lengths and `a` that are not multiples of a tile,
so that the padding paths run. Each case is one jitted forward + backward.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import pallas_additive as pa
from attention_jax import scores

attention_lib = importlib.import_module("attention_jax.attention")

BLOCKS = pa.Blocks(8, 8, 8)
B, TQ, TK, D, A, DV = 2, 11, 13, 5, 20, 6


def _normal(rng, *shape, scale=1.0):
  # NumPy, not jax.random: every new shape would compile a program (seconds here).
  return (scale * rng.standard_normal(shape)).astype(np.float32)


def _inputs(seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  args = (_normal(rng, B, TQ, D), _normal(rng, B, TK, D), _normal(rng, B, TK, DV),
          _normal(rng, D, A, scale=0.5), _normal(rng, D, A, scale=0.5), _normal(rng, A))
  return tuple(jnp.asarray(x, dtype) for x in args), jnp.asarray(_normal(rng, B, TQ, DV))


def _value_and_grads(fn, args, cot):
  """The context and the gradients of Σ context · cot in every argument (one
  jitted program: in interpret mode each compile takes seconds)."""
  def loss(*a):
    out = fn(*a)
    return jnp.sum(out.astype(jnp.float32) * cot), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args))),
                                               has_aux=True))(*args)
  return out, grads


def _plain(mask=None, **kw):
  def fn(q, k, values, w_q, w_k, v):
    return aj.attention(q, k, values, score="additive", params=dict(w_q=w_q, w_k=w_k, v=v),
                        mask=mask, implementation="plain", **kw)
  return fn


def _kernel(mask=None):
  def fn(q, k, values, w_q, w_k, v):
    return pa.additive_attention(q, k, values, w_q, w_k, v, mask, blocks=BLOCKS,
                                 interpret=True)
  return fn


NAMES = ("query", "keys", "values", "w_q", "w_k", "v")


def _assert_close(got, want, atol, rtol, what):
  for name, g, w in zip(NAMES, got, want):
    assert g.dtype == w.dtype, (what, name)
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               atol=atol, rtol=rtol, err_msg=f"{what}: {name}")


def test_values_and_gradients_match_the_plain_form():
  args, cot = _inputs()
  out, grads = _value_and_grads(_kernel(), args, cot)
  ref_out, ref_grads = _value_and_grads(_plain(), args, cot)
  assert out.shape == (B, TQ, DV) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  _assert_close(grads, ref_grads, atol=1e-5, rtol=1e-5, what="float32")


def test_masks_and_fully_masked_rows_match_the_plain_form():
  # Through `attention`: a random dense mask in which query 4 of sentence 0
  # sees no key, causal, and key padding where sentence 1 has no key at all.
  args, cot = _inputs(seed=1)
  dense = np.random.default_rng(7).random((B, TQ, TK)) < 0.7
  dense[0, 4] = False
  masks = dict(mask=dense, causal=True, key_lengths=jnp.array([TK, 0]))

  def via_attention(q, k, values, w_q, w_k, v):
    return aj.attention(q, k, values, score="additive", params=dict(w_q=w_q, w_k=w_k, v=v),
                        implementation="pallas", **masks)

  out, grads = _value_and_grads(via_attention, args, cot)
  ref_out, ref_grads = _value_and_grads(_plain(**masks), args, cot)
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  _assert_close(grads, ref_grads, atol=1e-5, rtol=1e-5, what="masks")
  assert np.all(np.asarray(out[0, 4]) == 0)  # attends to nothing: zero context
  assert np.all(np.asarray(out[1]) == 0)  # the sentence without keys
  assert np.any(np.asarray(out[0, 5]) != 0)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  # Sentence 1's queries, keys and values get no gradient: it attends to nothing.
  for name, g in zip(NAMES[:3], grads[:3]):
    assert np.all(np.asarray(g[1]) == 0), name


def test_bfloat16_inputs_accumulate_in_float32():
  # bfloat16 in, bfloat16 out, near the float32 computation on the same
  # (rounded) inputs: the output within 2**-7 of its largest entry (the plain
  # form in bfloat16, whose tanh and scores are bfloat16, misses by 2**-7.5
  # here, the kernel by 2**-8.7); the gradients, whose cotangent and weights
  # are rounded to bfloat16 for the matmuls, within 2**-5.
  args, cot = _inputs(seed=2, dtype=jnp.bfloat16)
  out, grads = _value_and_grads(_kernel(), args, cot)
  wide = tuple(x.astype(jnp.float32) for x in args)
  ref_out, ref_grads = _value_and_grads(_plain(), wide, cot)
  assert out.dtype == jnp.bfloat16
  scale = float(np.max(np.abs(ref_out)))
  np.testing.assert_allclose(np.asarray(out, np.float32), ref_out, atol=2 ** -7 * scale)
  for name, g, w in zip(NAMES, grads, ref_grads):
    assert g.dtype == jnp.bfloat16, name
    tol = 2 ** -5 * float(np.max(np.abs(w)))
    np.testing.assert_allclose(np.asarray(g, np.float32), w, atol=tol, err_msg=name)


def test_per_head_projections_and_v():
  # The Transformer's per-head additive score: [B, H, T, a] projections and
  # one v per head, against `scores.additive_projected` + `attend`.
  h, a = 3, 12
  rng = np.random.default_rng(3)
  q_proj, k_proj = _normal(rng, B, h, 9, a), _normal(rng, B, h, 10, a)
  values, v = _normal(rng, B, h, 10, DV), _normal(rng, h, a, scale=0.5)
  cot = _normal(rng, B, h, 9, DV)

  def kernel(q_proj, k_proj, values, v):
    return pa.additive_attention_projected(q_proj, k_proj, values, v, blocks=BLOCKS,
                                           interpret=True)

  def plain(q_proj, k_proj, values, v):
    logits = jax.vmap(scores.additive_projected, in_axes=(1, 1, 0), out_axes=1)(
        q_proj, k_proj, v)  # [B, H, Tq, Tk]
    return aj.attend(logits, values)[0]

  out, grads = _value_and_grads(kernel, (q_proj, k_proj, values, v), cot)
  ref_out, ref_grads = _value_and_grads(plain, (q_proj, k_proj, values, v), cot)
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  for g, w in zip(grads, ref_grads):
    assert g.shape == w.shape
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend, tk, a, expected", [
    ("cpu", 4096, 1024, "plain"),  # never interpret mode in production
    ("gpu", 4096, 1024, "pallas"),  # 8 x 3 x 4096 x 1024 > 2**22: plain would chunk
    ("gpu", 64, 64, "plain"),  # small enough for one fused XLA program
    ("tpu", 4096, 1024, "pallas"),
    ("tpu", 65536, 1024, "plain"),  # one head's keys would not fit the VMEM limit
])
def test_auto_takes_pallas_where_plain_would_chunk(monkeypatch, backend, tk, a, expected):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  q, k = jax.ShapeDtypeStruct((8, 3, 64), jnp.float32), jax.ShapeDtypeStruct((8, tk, 64),
                                                                              jnp.float32)
  params = dict(w_q=jnp.zeros((64, a)), w_k=jnp.zeros((64, a)), v=jnp.zeros((a,)))
  assert attention_lib.select_implementation("additive", "auto", q, k, k,
                                             params=params) == expected
  assert attention_lib.select_implementation("additive", "auto", q, k, k, params=params,
                                             return_weights=True) == "plain"


@pytest.mark.parametrize("score, params, weights", [
    ("additive", dict(w_q=jnp.zeros((4, 3)), w_k=jnp.zeros((4, 3)), v=jnp.zeros(3)), True),
    ("scaled_dot", {}, False),
    ("additive", dict(w_q=jnp.zeros((2, 4, 3)), w_k=jnp.zeros((2, 4, 3)), v=jnp.zeros((2, 3))),
     False),
])
def test_explicit_pallas_refuses_what_it_cannot_serve(score, params, weights):
  q = jnp.ones((2, 3, 4))
  with pytest.raises(ValueError, match="`implementation='pallas'` supports score 'additive'"):
    attention_lib.select_implementation(score, "pallas", q, q, q, params=params,
                                        return_weights=weights)


def test_bad_inputs_name_the_argument():
  (q, k, values, w_q, w_k, v), _ = _inputs()
  with pytest.raises(TypeError, match="`mask`"):
    pa.additive_attention(q, k, values, w_q, w_k, v, jnp.ones((TQ, TK)), interpret=True)
  with pytest.raises(ValueError, match="`w_q"):
    pa.additive_attention(q, k, values, w_q[:, :3], w_k, v, interpret=True)
  with pytest.raises(ValueError, match="`values"):
    pa.additive_attention(q, k, values[:, :4], w_q, w_k, v, interpret=True)
  with pytest.raises(ValueError, match="`rows`"):
    pa.Blocks(0, 8, 8)


def test_tpu_vmem_grows_with_the_resident_keys():
  # One head's projected keys (T x a float32) are one block, double-buffered.
  blocks = pa.default_blocks("tpu")
  small = pa.tpu_vmem_bytes(1024, 1024, 1024, 64, blocks)
  large = pa.tpu_vmem_bytes(1024, 4096, 1024, 64, blocks)
  assert 2 * 1024 * 1024 * 4 <= small < pa.TPU_VMEM_LIMIT_BYTES
  assert large - small >= 2 * 3072 * 1024 * 4
