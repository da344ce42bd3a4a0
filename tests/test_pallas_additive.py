"""attention_jax/pallas_additive/: the fused additive kernels in Pallas's
interpret mode (CPU), against the plain form (`attention(implementation='plain')`,
i.e. `scores.additive` + `attend`) and its `jax.grad`; both backward forms
(`fused`, the default here, and `split`, the TPU's); the approximate tanh
against a tolerance derived from its error; how many tanh the kernels
evaluate; the time floor (`roofline`) and the tile candidates. A GPU runs two
more tests (the hardware's approximate tanh, the compiled kernels' forms).

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


def _kernel(mask=None, **kw):
  def fn(q, k, values, w_q, w_k, v):
    return pa.additive_attention(q, k, values, w_q, w_k, v, mask, blocks=BLOCKS,
                                 interpret=True, **kw)
  return fn


NAMES = ("query", "keys", "values", "w_q", "w_k", "v")


def _assert_close(got, want, atol, rtol, what):
  for name, g, w in zip(NAMES, got, want):
    assert g.dtype == w.dtype, (what, name)
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               atol=atol, rtol=rtol, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("backward", ["fused", "split"])
def test_values_and_gradients_match_the_plain_form(backward):
  args, cot = _inputs()
  out, grads = _value_and_grads(_kernel(backward=backward), args, cot)
  ref_out, ref_grads = _value_and_grads(_plain(), args, cot)
  assert out.shape == (B, TQ, DV) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  _assert_close(grads, ref_grads, atol=1e-5, rtol=1e-5, what="float32")


@pytest.mark.parametrize("backward", ["fused", "split"])
def test_masks_and_fully_masked_rows_match_the_plain_form(monkeypatch, backward):
  # Through `attention`: a random dense mask in which query 4 of sentence 0
  # sees no key, causal, and key padding where sentence 1 has no key at all.
  # `attention` takes the platform's default backward form: each is forced.
  monkeypatch.setattr(pa, "default_backward", lambda platform: backward)
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
  with pytest.raises(ValueError, match="`backward`"):
    pa.additive_attention(q, k, values, w_q, w_k, v, backward="both", interpret=True)
  with pytest.raises(ValueError, match="`tanh_impl`"):
    pa.additive_attention(q, k, values, w_q, w_k, v, tanh_impl="fast", interpret=True)


def test_a_tpu_refuses_the_fused_backward_and_the_approximate_tanh(monkeypatch):
  # Mosaic has neither an atomic add nor tanh.approx: refused before tracing.
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  (q, k, values, w_q, w_k, v), _ = _inputs()
  assert pa.default_backward("tpu") == "split"
  for kw in (dict(backward="fused"), dict(tanh_impl="approx")):
    with pytest.raises(ValueError, match="on a TPU"):
      pa.additive_attention(q, k, values, w_q, w_k, v, interpret=False, **kw)


def test_tpu_vmem_grows_with_the_resident_keys():
  # One head's projected keys (T x a float32) are one block, double-buffered.
  blocks = pa.default_blocks("tpu")
  small = pa.tpu_vmem_bytes(1024, 1024, 1024, 64, blocks)
  large = pa.tpu_vmem_bytes(1024, 4096, 1024, 64, blocks)
  assert 2 * 1024 * 1024 * 4 <= small < pa.TPU_VMEM_LIMIT_BYTES
  assert large - small >= 2 * 3072 * 1024 * 4


# ----------------------------------------------------------------------------
# How many tanh the kernels evaluate.


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("tanh_impl", ["accurate", "approx"])
def test_three_tanh_evaluations_per_element_over_forward_and_backward(monkeypatch, platform,
                                                                       tanh_impl):
  # Counted in the traced program of one forward + backward
  # (`pa.tanh_evaluations`: in each Pallas kernel, every tanh's elements times
  # the trip counts of the loops around it, times the programs of its grid),
  # per (query, key, feature) of the padded problem. "gpu" traces the Triton
  # kernels as a GPU would compile them (tracing lowers nothing, so no GPU is
  # needed), where the approximate tanh is inline assembly. Per element: the
  # forward 1, the fused backward 2 (the default here); the split backward
  # (the only one before, still the GPU's default) 2 in `dq` and 2 in `dkv`,
  # 5 in all.
  monkeypatch.setattr(jax, "default_backend", lambda: platform)
  args, cot = _inputs()
  # Padded: interpret mode's 8 x 8 x 8 tiles give Tq = Tk = 16, a = 24; the
  # GPU's default 16 x 16 x 32, Tq = Tk = 16 and a = 32.
  elements = B * 16 * 16 * (24 if platform == "cpu" else 32)
  blocks = BLOCKS if platform == "cpu" else None

  def counts(**kw):
    def loss(q, k, values, w_q, w_k, v):
      out = pa.additive_attention(q, k, values, w_q, w_k, v, blocks=blocks,
                                  interpret=platform == "cpu", tanh_impl=tanh_impl, **kw)
      return jnp.sum(out * cot)
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(6))))(*args)
    return {name: n / elements for name, n in pa.tanh_evaluations(jaxpr).items()}

  fused = counts(backward="fused")
  assert fused == {"additive_attention_fwd": 1, "additive_attention_bwd": 2}
  assert sum(fused.values()) <= 3
  if platform == "cpu":
    assert counts() == fused
  assert counts(backward="split") == {"additive_attention_fwd": 1, "additive_attention_dq": 2,
                                      "additive_attention_dkv": 2}


# ----------------------------------------------------------------------------
# The approximate tanh.


def _dense_grid():
  """float32 inputs: [-10, 10] evenly, and log-spaced from 1e-30 to 10 on
  both sides (near 0 tanh(x) ≈ x, where a relative error shows)."""
  tail = np.geomspace(1e-30, 10.0, 1_000_001)
  return np.concatenate([np.linspace(-10.0, 10.0, 4_000_001), tail, -tail]).astype(np.float32)


def _max_relative_error(got, x):
  want = np.tanh(x.astype(np.float64))
  got = np.asarray(got, np.float64)
  assert np.all(got[want == 0] == 0)
  nonzero = want != 0
  return float(np.max(np.abs(got[nonzero] - want[nonzero]) / np.abs(want[nonzero])))


def test_approx_tanh_model_error_over_a_dense_grid():
  # The model interpret mode uses for tanh_impl="approx", on the CPU, against
  # float64 tanh over 6M points: 1.5281e-5 measured (jax 0.10.2's XLA CPU
  # tanh, then 16 fraction bits kept). It must be at least the GPU
  # instruction's 1.113e-5, so that the CPU tests see the GPU's error, and
  # within the bound the tolerances are derived from.
  x = _dense_grid()
  with jax.default_device(jax.devices("cpu")[0]):
    got = np.asarray(jax.jit(pa.approx_tanh_model)(x))
  err = _max_relative_error(got, x)
  assert err == pytest.approx(1.5281e-5, abs=1e-9)
  assert 1.113e-5 < err <= pa.APPROX_TANH_MAX_REL_ERROR
  want = np.tanh(x.astype(np.float64))
  assert np.all(np.abs(got) <= 1) and np.all(got * want >= 0)


@jax.custom_jvp
def _model_tanh(x):
  return pa.approx_tanh_model(x)


@_model_tanh.defjvp
def _model_tanh_jvp(primals, tangents):
  # The kernels' derivative: 1 - h² of the approximate h itself.
  (x,), (t,) = primals, tangents
  y = _model_tanh(x)
  return y, (1.0 - y * y) * t


def _plain_projected(tanh):
  """The additive attention of projections, written out with `tanh`."""
  def fn(q_proj, k_proj, values, v):
    hidden = tanh(q_proj[..., :, None, :] + k_proj[..., None, :, :])  # [N, Tq, Tk, a]
    return aj.attend(jnp.einsum("...ijf,f->...ij", hidden, v), values)[0]
  return fn


def _approx_error_bounds(q_proj, k_proj, values, v, cot, eps):
  """Bounds on |approximate - exact| of the context and of the gradients of
  Σ context · cot in q_proj, k_proj, values and v (one v `[a]`), for a tanh
  whose relative error is at most `eps`; float64, elementwise.

  With h̃ = h(1 + e), |e| ≤ eps, |h̃| ≤ 1 (the model never exceeds tanh; the
  GPU instruction saturates at ±1): each score moves by at most
  Δ = eps·Σ|v_f|, so each weight by at most p·η with η = exp(2Δ) - 1
  (p̃/p = exp(δs_j) / Σ_k p_k exp(δs_k)), the context by η Σ_j p_ij |values_j|
  and the values' gradient by η Σ_i p_ij |cot_i|. With dp_ij = cot_i ·
  values_j, M_i = max_j |dp_ij| and ds = p (dp - Σ_j p dp): |δds| ≤ 3η p M
  (|dp - δ̃| ≤ 2M and |δ - δ̃| ≤ ηM), |ds| ≤ 2pM, |h² - h̃²| ≤ 2eps + eps²,
  hence for d q'_if = v_f Σ_j ds (1 - h²): |δ| ≤ |v_f| M_i (3η + 2(2eps + eps²)),
  likewise d k'_jf summed over i with weights p_ij M_i, and for
  d v_f = Σ ds·h: |δ| ≤ Σ_i M_i (3η + 2eps)."""
  q, k, vals, w, c = (np.asarray(x, np.float64) for x in (q_proj, k_proj, values, v, cot))
  s = np.einsum("nijf,f->nij", np.tanh(q[:, :, None, :] + k[:, None, :, :]), w)
  p = np.exp(s - s.max(axis=-1, keepdims=True))
  p /= p.sum(axis=-1, keepdims=True)
  m = np.max(np.abs(np.einsum("nic,njc->nij", c, vals)), axis=-1)  # M_i, [N, Tq]
  eta = np.expm1(2 * eps * np.sum(np.abs(w)))
  grad = 3 * eta + 2 * (2 * eps + eps ** 2)
  return (eta * np.einsum("nij,njc->nic", p, np.abs(vals)),
          (grad * m[:, :, None] * np.abs(w),
           grad * np.einsum("nij,ni->nj", p, m)[:, :, None] * np.abs(w),
           eta * np.einsum("nij,nic->njc", p, np.abs(c)),
           np.full(w.shape, (3 * eta + 2 * eps) * np.sum(m))))


def _projected_inputs(seed, b, tq, tk, a, dv):
  rng = np.random.default_rng(seed)
  return ((_normal(rng, b, tq, a), _normal(rng, b, tk, a), _normal(rng, b, tk, dv),
           _normal(rng, a, scale=0.5)), _normal(rng, b, tq, dv))


def test_approximate_tanh_kernels_within_the_bound_derived_from_its_error():
  args, cot = _projected_inputs(4, B, TQ, TK, A, DV)

  def kernel(tanh_impl):
    def fn(q_proj, k_proj, values, v):
      return pa.additive_attention_projected(q_proj, k_proj, values, v, blocks=BLOCKS,
                                             interpret=True, tanh_impl=tanh_impl)
    return fn

  out, grads = _value_and_grads(kernel("approx"), args, cot)
  # The kernels take the approximate tanh everywhere, the backward's 1 - h²
  # included: equal to the plain form written with the same model, to the
  # float32 tolerances of the accurate kernels.
  model_out, model_grads = _value_and_grads(_plain_projected(_model_tanh), args, cot)
  np.testing.assert_allclose(out, model_out, atol=2e-6, rtol=1e-5)
  for g, w in zip(grads, model_grads):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
  # Against the exact tanh: within the bound of a tanh off by at most
  # APPROX_TANH_MAX_REL_ERROR (which the GPU's instruction is within too),
  # plus the float32 tolerances on either side.
  exact_out, exact_grads = _value_and_grads(_plain_projected(jnp.tanh), args, cot)
  out_bound, grad_bounds = _approx_error_bounds(*args, cot, pa.APPROX_TANH_MAX_REL_ERROR)
  assert np.all(np.abs(out - exact_out) <= out_bound + 2 * (2e-6 + 1e-5 * np.abs(exact_out)))
  for name, g, w, bound in zip(("q_proj", "k_proj", "values", "v"), grads, exact_grads,
                               grad_bounds):
    assert np.all(np.abs(g - w) <= bound + 2 * (1e-5 + 1e-5 * np.abs(w))), name
  accurate_out, _ = _value_and_grads(kernel("accurate"), args, cot)
  assert np.max(np.abs(out - accurate_out)) > 1e-6  # the option takes effect


# ----------------------------------------------------------------------------
# The time floor and the tile candidates (pure).


def test_roofline_is_bound_by_the_special_function_unit():
  # The benchmark's additive shape: B 32, T 1024, d 64, a 1024, H200 rates.
  # 16 special-function results per clock per SM x 132 SMs x 1.98 GHz.
  assert pa.H200_SXM.sfu_ops == pytest.approx(4.18176e12)
  pairs = 32 * 1024 * 1024
  split = pa.roofline(32, 1024, 1024, 1024, 64, backward="split")
  fused = pa.roofline(32, 1024, 1024, 1024, 64, backward="fused")
  assert (split["tanh"], fused["tanh"]) == (5 * pairs * 1024, 3 * pairs * 1024)
  assert split["bound"] == fused["bound"] == "sfu"
  # The FMA pipes' share (67 TFLOP/s): 10.0 and 7.4 ms.
  assert (split["flops_s"], fused["flops_s"]) == (pytest.approx(10.0e-3, abs=0.05e-3),
                                                  pytest.approx(7.4e-3, abs=0.05e-3))
  # tanh and the three (split) or two (fused) exps per (query, key).
  assert split["floor_s"] == pytest.approx((5 * 1024 + 3) * pairs / 4.18176e12)
  assert split["floor_s"] == pytest.approx(41.1e-3, abs=0.05e-3)
  assert fused["floor_s"] == pytest.approx(24.7e-3, abs=0.05e-3)
  assert pa.roofline(32, 1024, 1024, 1024, 64, passes="fwd")["floor_s"] == pytest.approx(
      8.2e-3, abs=0.05e-3)
  # T 4096: 16 times the pairs.
  assert pa.roofline(32, 4096, 4096, 1024, 64, passes="fwd")["floor_s"] == pytest.approx(
      131.6e-3, abs=0.05e-3)
  assert pa.roofline(32, 4096, 4096, 1024, 64, backward="split")["floor_s"] == pytest.approx(
      657.7e-3, abs=0.05e-3)
  assert pa.roofline(32, 4096, 4096, 1024, 64)["floor_s"] == pytest.approx(394.7e-3,
                                                                           abs=0.05e-3)
  # If the accurate tanhf took two special-function results, the floor doubles.
  assert pa.roofline(32, 1024, 1024, 1024, 64, backward="split",
                     sfu_per_tanh=2)["floor_s"] == pytest.approx(82.2e-3, abs=0.05e-3)
  # The bound it replaces took every FLOP at the bf16 matmul peak: 0.68 ms
  # for these kernels, 1/60 of the special-function floor.
  assert split["flops"] / 989e12 < split["floor_s"] / 60
  assert fused["atomic_adds"] == 32 * (1024 // 16) * 1024 * 1024 and split["atomic_adds"] == 0


def test_tile_candidates_fit_the_budgets():
  gpu = pa.tile_candidates("gpu", 1024, 1024, 1024, 64)
  assert pa.default_blocks("gpu") in gpu
  for b in gpu:
    for size in (b.rows, b.cols, b.chunk):
      assert size >= 16 and size & (size - 1) == 0
    assert b.num_warps in (4, 8)
    assert b.rows * b.cols * b.chunk <= pa.GPU_TILE_FLOATS_PER_THREAD * 32 * b.num_warps
  # 64 float32 per thread of 4 warps: 8,192 tanh values; of 8 warps, 16,384.
  assert [b for b in gpu if b.num_warps == 4] == [
      pa.Blocks(16, 16, 16), pa.Blocks(16, 16, 32), pa.Blocks(16, 32, 16),
      pa.Blocks(32, 16, 16)]
  assert len(gpu) == 14
  # No side longer than what it tiles.
  assert {(b.rows, b.cols) for b in pa.tile_candidates("gpu", 16, 16, 1024, 64)} == {(16, 16)}
  tpu = pa.tile_candidates("tpu", 1024, 1024, 1024, 64)
  assert pa.default_blocks("tpu") in tpu
  for b in tpu:
    assert b.rows % 8 == 0 and b.cols % 128 == 0 and b.chunk % 128 == 0
    assert pa.tpu_vmem_bytes(1024, 1024, 1024, 64, b, False) <= pa.TPU_VMEM_LIMIT_BYTES
  # One head's keys (65,536 x 1,024 float32, double-buffered) exceed the VMEM limit.
  assert pa.tile_candidates("tpu", 65536, 65536, 1024, 64) == []
  with pytest.raises(ValueError, match="`platform`"):
    pa.tile_candidates("cpu", 1024, 1024, 1024, 64)


def test_the_tile_search_times_nothing_on_a_cpu():
  from experiments.kernels import additive as bench  # pylint: disable=import-outside-toplevel
  from experiments.kernels import settings  # pylint: disable=import-outside-toplevel
  rows = []
  assert bench.tile_search(settings.PRESETS["tiny"], rows.append, 16) == 0
  assert [(r["suite"], r["status"]) for r in rows] == [("additive_tiles", "skipped")]
  assert bench.parse_tile("16x32x64w8") == pa.Blocks(16, 32, 64, 8)
  assert bench.parse_tile("16x16x32") == pa.default_blocks("gpu")
  with pytest.raises(ValueError, match="ROWSxCOLSxCHUNK"):
    bench.parse_tile("16x16")


# ----------------------------------------------------------------------------
# On a GPU only: the compiled kernels.

_GPU = pytest.mark.skipif(jax.default_backend() != "gpu",
                          reason="needs a GPU: the Triton kernels and tanh.approx.f32")


@_GPU
def test_gpu_approx_tanh_error_over_a_dense_grid():
  # tanh.approx.f32 through a Triton kernel, on the grid the model was
  # measured on: within APPROX_TANH_MAX_REL_ERROR (1.113e-5 measured by
  # others over all float32 inputs).
  from jax.experimental import pallas as pl  # pylint: disable=import-outside-toplevel
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=import-outside-toplevel
  x = _dense_grid()
  block = 1024
  padded = np.pad(x, (0, -len(x) % block))

  def kernel(x_ref, o_ref):
    o_ref[...] = pltriton.approx_tanh(x_ref[...])

  spec = pl.BlockSpec((block,), lambda i: (i,))
  got = pl.pallas_call(kernel, grid=(len(padded) // block,), in_specs=[spec], out_specs=spec,
                       out_shape=jax.ShapeDtypeStruct(padded.shape, jnp.float32))(padded)
  err = _max_relative_error(np.asarray(got)[:len(x)], x)
  print(f"tanh.approx.f32: max relative error {err:.4e} over {len(x)} points")
  assert err <= pa.APPROX_TANH_MAX_REL_ERROR


@_GPU
@pytest.mark.parametrize("backward, tanh_impl", [("fused", "accurate"), ("split", "accurate"),
                                                 ("fused", "approx")])
def test_gpu_compiled_kernel_forms_match_the_plain_form(backward, tanh_impl):
  # Compiled (Triton) at sizes that are no multiple of the default tiles.
  # Accurate: to 1e-4 of each quantity's largest magnitude (TF32-free float32
  # on both sides, as tests/gpu/test_gpu.py); approx: plus the derived bound.
  args, cot = _projected_inputs(5, 2, 300, 300, 200, 48)

  def kernel(q_proj, k_proj, values, v):
    return pa.additive_attention_projected(q_proj, k_proj, values, v, backward=backward,
                                           tanh_impl=tanh_impl)

  with jax.default_matmul_precision("highest"):
    out, grads = _value_and_grads(kernel, args, cot)
    ref_out, ref_grads = _value_and_grads(_plain_projected(jnp.tanh), args, cot)
  eps = pa.APPROX_TANH_MAX_REL_ERROR if tanh_impl == "approx" else 0.0
  out_bound, grad_bounds = _approx_error_bounds(*args, cot, eps)
  for name, g, w, bound in zip(("out", "q_proj", "k_proj", "values", "v"),
                               (out,) + tuple(grads), (ref_out,) + tuple(ref_grads),
                               (out_bound,) + tuple(grad_bounds)):
    scale = float(np.max(np.abs(w))) + 1e-6
    assert np.all(np.abs(np.asarray(g) - w) <= bound + 1e-4 * scale), name
