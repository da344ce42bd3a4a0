"""Causal and length-padding masks passed as `causal` / `query_lengths` /
`key_lengths`: the form in which they reach cuDNN's fused kernel (as jax.nn's
`is_causal` and sequence lengths) instead of a dense `[.., Tq, Tk]` mask.

On CPU the fused XLA kernel with the same arguments stands in for cuDNN (jax
implements both from them); tests/gpu compares cuDNN itself."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj

attention_lib = importlib.import_module("attention_jax.attention")

B, H, TQ, TK, D = 3, 2, 12, 10, 8


def _qkv(seed=0, tq=TQ, tk=TK, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(kq, (B, H, tq, D)).astype(dtype),
          jax.random.normal(kk, (B, H, tk, D)).astype(dtype),
          jax.random.normal(kv, (B, H, tk, D)).astype(dtype))


def _dense(q_len, k_len, causal, tq=TQ, tk=TK):
  """The same mask written out by hand, [B, 1, Tq, Tk]."""
  m = np.ones((B, 1, tq, tk), bool)
  for b in range(B):
    for i in range(tq):
      for j in range(tk):
        ok = True
        if causal:
          ok &= j <= i
        if q_len is not None:
          ok &= i < q_len[b]
        if k_len is not None:
          ok &= j < k_len[b]
        m[b, 0, i, j] = ok
  return m


CASES = {
    "causal": (None, None, True),
    "keys": (None, [TK, 4, 1], False),
    "queries": ([TQ, 5, 2], None, False),
    "both_causal": ([TK, 7, 3], [TK, 6, 2], True),
    "no_keys": (None, [TK, 0, 3], False),  # a sentence with no key: zero context
}


def _value_and_grads(fn, q, k, v):
  """`fn(q, k, v)` and the gradients of its sum of squares in q, k and v: one
  compiled program (eager, every primitive of the backward pass compiles on
  its own)."""
  def loss(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(out ** 2), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


@functools.lru_cache(maxsize=None)
def _dense_reference(name):
  """(q, k, v, plain attention with the dense mask, its gradients) of a case:
  computed once for the three implementations."""
  q_len, k_len, causal = CASES[name]
  tq = tk = TK if causal else None
  q, k, v = _qkv(tq=tq or TQ, tk=tk or TK)
  dense = jnp.asarray(_dense(q_len, k_len, causal, tq=q.shape[2], tk=k.shape[2]))
  want, want_grads = _value_and_grads(
      lambda q, k, v: aj.attention(q, k, v, mask=dense, implementation="plain"), q, k, v)
  return (q, k, v), want, want_grads


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("implementation", ["plain", "blockwise", "xla"])
def test_lengths_and_causal_equal_the_dense_mask(implementation, name):
  q_len, k_len, causal = CASES[name]
  (q, k, v), want, want_grads = _dense_reference(name)

  def run(q, k, v):
    return aj.attention(q, k, v, causal=causal,
                        query_lengths=None if q_len is None else jnp.asarray(q_len),
                        key_lengths=None if k_len is None else jnp.asarray(k_len),
                        implementation=implementation)

  # the output and the gradients too (the fused kernels have their own backward)
  got, grads = _value_and_grads(run, q, k, v)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for a, b in zip(grads, want_grads):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  if name == "no_keys":
    assert np.all(np.asarray(got)[1] == 0)


def test_structured_and_dense_masks_combine():
  q, k, v = _qkv(tq=TK)
  extra = jax.random.bernoulli(jax.random.PRNGKey(3), 0.7, (B, H, TK, TK))
  k_len = jnp.asarray([TK, 6, 3])
  dense = jnp.asarray(_dense(None, [TK, 6, 3], True, tq=TK)) & extra
  # jitted: one compile each instead of one per primitive
  want = jax.jit(lambda q, k, v: aj.attention(q, k, v, mask=dense, implementation="plain"))(
      q, k, v)
  for implementation in ("plain", "xla"):
    got = jax.jit(lambda q, k, v: aj.attention(q, k, v, mask=extra, causal=True,
                                               key_lengths=k_len,
                                               implementation=implementation))(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_structured_mask_is_the_dense_form():
  m = aj.attention.__globals__["structured_mask"](4, 4, causal=True,
                                                  key_lengths=jnp.asarray([4, 2, 0]))
  assert m.shape == (3, 1, 4, 4) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(m, _dense(None, [4, 2, 0], True, tq=4, tk=4)[:3])


@pytest.mark.parametrize("kwargs,needle", [
    (dict(key_lengths=jnp.asarray([1, 2])), "`key_lengths` must have the batch axes' shape (3,)"),
    (dict(query_lengths=jnp.asarray([1.0, 2.0, 3.0])), "query_lengths"),
    (dict(key_lengths=jnp.asarray([1, 2, TK + 1])), "`key_lengths` must lie in [0, 10]"),
    (dict(key_lengths=jnp.asarray([-1, 2, 3])), "`key_lengths` must lie in [0, 10]"),
])
def test_bad_lengths_name_the_argument(kwargs, needle):
  q, k, v = _qkv()
  with pytest.raises((ValueError, TypeError)) as e:
    aj.attention(q, k, v, **kwargs)
  assert needle in str(e.value)


def _uncompilable_cudnn(q, k, v, **_):
  """Traces and lowers like an attention kernel, but XLA cannot compile it (no
  handler for the custom call): a refusal that shows only at compile time."""
  return jax.ffi.ffi_call("attention_jax_test_missing_kernel",
                          jax.ShapeDtypeStruct(q.shape, q.dtype))(q)


def test_auto_falls_back_to_xla_when_cudnn_fails_to_compile(monkeypatch):
  q, k, v = _qkv(tq=TK, dtype=jnp.bfloat16)
  k_len = jnp.asarray([TK, 5, 2])
  want = aj.attention(q, k, v, causal=True, key_lengths=k_len, implementation="plain")
  # A GPU where cuDNN's attention traces and lowers but does not compile.
  monkeypatch.setattr(attention_lib, "_cudnn_applies", lambda q, m: True)
  monkeypatch.setattr(attention_lib, "_cudnn_attention", _uncompilable_cudnn)
  monkeypatch.setattr(attention_lib, "_CUDNN_COMPILES", {})
  monkeypatch.setattr(attention_lib, "select_implementation", lambda *a, **k: "fused")
  got = jax.jit(lambda q, k, v: aj.attention(q, k, v, causal=True, key_lengths=k_len))(q, k, v)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             atol=3e-2)
  assert list(attention_lib._CUDNN_COMPILES.values()) == [False]  # probed once, refused


def test_auto_uses_cudnn_where_it_compiles(monkeypatch):
  calls = []

  def stand_in(q, k, v, *, scale, is_causal, query_seq_lengths, key_value_seq_lengths):
    calls.append(is_causal)
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=is_causal,
                                        query_seq_lengths=query_seq_lengths,
                                        key_value_seq_lengths=key_value_seq_lengths)

  monkeypatch.setattr(attention_lib, "_cudnn_applies", lambda q, m: True)
  monkeypatch.setattr(attention_lib, "_cudnn_attention", stand_in)
  monkeypatch.setattr(attention_lib, "_CUDNN_COMPILES", {})
  monkeypatch.setattr(attention_lib, "select_implementation", lambda *a, **k: "fused")
  q, k, v = _qkv(tq=TK, dtype=jnp.bfloat16)
  aj.attention(q, k, v, causal=True)
  assert calls and all(calls) and list(attention_lib._CUDNN_COMPILES.values()) == [True]
