"""Tests of the score functions, over the registry: every registered score's
pure function (`function`, against its naive form `naive`) and the logits of
its layer forms (`rnn`, `mha`, against their NumPy references) -- values in
float32 and bfloat16, shapes, dtypes, broadcasting, jit / vmap / grad -- and
what particular functions of scores.py promise (the chunked additive score,
cosine's norm clamp, QKNorm's g, errors, float32 logits).

Shape glossary: B batch, H heads, Tq / Tk lengths, d features, a attention
size, L the longest key axis a form's parameters are built for.
"""

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import registry, scores
from attention_jax import score_kinds as kinds

B, H, TQ, TK, D, A = 2, 3, 4, 5, 8, 6
L = TK + 2  # longer than the keys: a location form slices its W_a to them

# bf16 keeps 8 significant bits (relative step 2**-8); sums of a few products
# of O(1) numbers then carry errors of a few 1e-2 at most.
TOLERANCE = {jnp.float32: dict(rtol=1e-5, atol=1e-5),
             jnp.bfloat16: dict(rtol=3e-2, atol=6e-2)}


def _normal(rng, shape, dtype=jnp.float32):
  return jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype)


def _f64(x):
  return np.asarray(x, np.float64)


# -- every score function of the registry, against its entry's reference --------


@dataclasses.dataclass(frozen=True)
class Case:
  """One score function of an entry, on random inputs.

  `fn(*args)` -> scores `[..., Tq, Tk]`, with `args` = `(q, k, *array
  parameters)` (a parameter that is a module is closed over);
  `reference(*args)` the same scores by the entry's reference, the args
  given as float64 NumPy; `float32`: half-precision inputs give float32
  scores.
  """
  fn: Callable[..., Any]
  args: tuple
  reference: Callable[..., np.ndarray]
  float32: bool

  def expected(self) -> np.ndarray:
    """The reference of the same (rounded) inputs, in float64."""
    return self.reference(*[_f64(a) for a in self.args])


def _float32_scores(spec: registry.Score) -> bool:
  """Whether half-precision inputs give float32 scores: the dot-product family
  of scores.py (one product q·kᵀ, `one_product`, or one after a matrix is
  folded in, `dot_product`) accumulates and keeps its products in float32;
  the other scores keep their inputs' dtype."""
  return spec.one_product or spec.dot_product is not None


# Random values of the parameters the pure functions take, by parameter name,
# for queries of dq and keys of dk features.
FUNCTION_PARAMS = {
    "w": lambda rng, dq, dk, dtype: _normal(rng, (dq, dk), dtype) / math.sqrt(dq),
    "w_q": lambda rng, dq, dk, dtype: _normal(rng, (dq, A), dtype) / math.sqrt(dq),
    "w_k": lambda rng, dq, dk, dtype: _normal(rng, (dk, A), dtype) / math.sqrt(dk),
    "v": lambda rng, dq, dk, dtype: _normal(rng, (A,), dtype),
    "beta": lambda rng, dq, dk, dtype: jnp.asarray(2.5, dtype),
}


def function_case(spec, rng, dtype=jnp.float32, q_lead=(B, H), k_lead=(B, H), dq=D, dk=D,
                  function=None) -> Case:
  """The entry's pure function (or `function`, another form of it) against
  its naive form, given every parameter it requires and each option that
  `FUNCTION_PARAMS` knows."""
  missing = [p for p in spec.function_params if p not in FUNCTION_PARAMS]
  assert not missing, f"score {spec.name!r}: give FUNCTION_PARAMS values of {missing}"
  names = tuple(p for p in spec.function_params + spec.function_options
                if p in FUNCTION_PARAMS)
  q = _normal(rng, q_lead + (TQ, dq), dtype)  # [..., Tq, dq]
  k = _normal(rng, k_lead + (TK, dk), dtype)  # [..., Tk, dk]
  params = tuple(FUNCTION_PARAMS[p](rng, dq, dk, dtype) for p in names)
  fn = function or spec.function
  return Case(fn=lambda q, k, *p: fn(q, k, **dict(zip(names, p))), args=(q, k) + params,
              reference=lambda q, k, *p: _f64(spec.naive(q, k, **dict(zip(names, p)))),
              float32=_float32_scores(spec))


def _numpy_module(module) -> dict:
  """A module parameter as a form's reference takes it: the dict of its
  parameters (`Form.reference`)."""
  return jax.tree.map(_f64, nnx.to_pure_dict(nnx.state(module)))


def form_case(spec, layer, rng, dtype=jnp.float32, q_lead=(B, H), k_lead=(B, H), dq=D,
              dk=D) -> Case:
  """The logits of the entry's `layer` form ('rnn'; 'mha', whose heads are
  axis 1 of `q_lead`) against the form's NumPy reference, with the
  parameters the form makes, in `dtype` (as a layer casts them). A projected
  score's query and keys are projections of a = dq features."""
  form = getattr(spec, layer)
  assert form.reference is not None, f"score {spec.name!r}: its {layer} form has no reference"
  dims = kinds.Dims(dq, dk, dq, max_length=L, heads=H if layer == "mha" else None,
                    param_dtype=dtype)
  made = form.make_params(dims, nnx.Rngs(int(rng.integers(2 ** 30))))
  arrays = {n: p[...] for n, p in made.items() if isinstance(p, nnx.Variable)}
  modules = {n: p for n, p in made.items() if not isinstance(p, nnx.Variable)}
  numpy_modules = {n: _numpy_module(p) for n, p in modules.items()}
  names = tuple(arrays)
  q = _normal(rng, q_lead + (TQ, dq), dtype)  # [..., Tq, dq]
  k = _normal(rng, k_lead + (TK, dk), dtype)  # [..., Tk, dk]
  return Case(fn=lambda q, k, *p: form.logits(q, k, **dict(zip(names, p)), **modules),
              args=(q, k) + tuple(arrays.values()),
              reference=lambda q, k, *p: _f64(form.reference(
                  q, k, **dict(zip(names, p)), **numpy_modules)),
              float32=_float32_scores(spec))


def _layers(spec) -> tuple[str, ...]:
  """The entry's distinct layer forms: 'rnn', and 'mha' where it has its own."""
  return ("rnn",) if spec.mha is spec.rnn else ("rnn", "mha")


# Every score function of the registry, by id: `<score>:function` (the pure
# function), `<score>:rnn` and `<score>:mha` (the logits of the layer forms);
# and scores.additive_naive, the one-block form the chunked additive score is
# checked with.
CASES = {
    **{f"{n}:function": (n, "function") for n, s in registry.SCORES.items() if s.function},
    **{f"{n}:{layer}": (n, layer) for n, s in registry.SCORES.items() for layer in _layers(s)},
    "additive_naive": ("additive", "additive_naive"),
}
# The cases whose leading axes are free (a multi-head form maps its per-head
# parameters over axis 1).
FREE_LEAD = [c for c, (_, kind) in CASES.items() if kind != "mha"]
# Of those, the cases whose scores broadcast the leading axes of q and k: a
# per-position score's depend on the keys only by their count.
BROADCAST = [c for c in FREE_LEAD if not registry.get(CASES[c][0]).per_position]
# The cases whose query and key sizes may differ: the entry does not compare
# q and k directly, and the function gets them unprojected.
UNEQUAL_SIZES = [c for c, (n, kind) in CASES.items() if not registry.get(n).same_dim and (
    kind in ("function", "additive_naive") or (kind == "rnn" and not registry.get(n).projected))]


def case(case_id: str, rng, **kw) -> Case:
  name, kind = CASES[case_id]
  spec = registry.get(name)
  if kind == "function":
    return function_case(spec, rng, **kw)
  if kind == "additive_naive":
    return function_case(spec, rng, function=scores.additive_naive, **kw)
  return form_case(spec, kind, rng, **kw)


def test_every_registered_score_has_its_cases():
  named = {n for n, _ in CASES.values()}
  assert named == set(registry.SCORES)
  for name, spec in registry.SCORES.items():
    assert (f"{name}:function" in CASES) == (spec.function is not None)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case_id", CASES)
def test_score_matches_its_entrys_reference(case_id, dtype):
  c = case(case_id, np.random.default_rng(0), dtype=dtype)
  out = c.fn(*c.args)
  assert out.shape == (B, H, TQ, TK)
  # The dot-product family keeps half-precision products in float32.
  assert out.dtype == (jnp.float32 if c.float32 else dtype)
  np.testing.assert_allclose(_f64(out), c.expected(), **TOLERANCE[dtype])


@pytest.mark.parametrize("case_id", BROADCAST)
def test_leading_axes_broadcast(case_id):
  # q [2, 1, Tq, d] against k [3, Tk, d]: scores [2, 3, Tq, Tk].
  c = case(case_id, np.random.default_rng(1), q_lead=(2, 1), k_lead=(3,))
  out = c.fn(*c.args)
  assert out.shape == (2, 3, TQ, TK)
  np.testing.assert_allclose(out, c.expected(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case_id", UNEQUAL_SIZES)
def test_scores_that_do_not_compare_q_and_k_directly_allow_dq_ne_dk(case_id):
  c = case(case_id, np.random.default_rng(2), dq=3, dk=7)
  np.testing.assert_allclose(c.fn(*c.args), c.expected(), rtol=1e-5, atol=1e-5)


# -- what particular functions promise ------------------------------------------


# The entries' naive forms of the two scores whose particular promises follow.
COSINE_NAIVE = registry.get("cosine").naive
ADDITIVE_NAIVE = registry.get("additive").naive


def test_scaled_dot_is_dot_over_sqrt_d():
  rng = np.random.default_rng(3)
  q, k = _normal(rng, (TQ, 9)), _normal(rng, (TK, 9))
  np.testing.assert_allclose(scores.scaled_dot(q, k), scores.dot(q, k) / 3.0,
                             rtol=1e-6, atol=1e-6)


def test_inverse_dim_is_dot_over_d():
  rng = np.random.default_rng(3)
  q, k = _normal(rng, (TQ, 9)), _normal(rng, (TK, 9))
  np.testing.assert_allclose(scores.inverse_dim(q, k), scores.dot(q, k) / 9.0,
                             rtol=1e-6, atol=1e-6)


def test_qk_norm_init_is_henrys_log2_l2_minus_l():
  assert scores.qk_norm_init(2) == 1.0  # log2(4 - 2)
  np.testing.assert_allclose(scores.qk_norm_init(33), np.log2(33 * 32))
  for bad in (1, 0, -3):
    with pytest.raises(ValueError, match="`length`"):
      scores.qk_norm_init(bad)


def test_qk_norm_scores_are_bounded_by_g():
  rng = np.random.default_rng(5)
  q, k = 1e3 * _normal(rng, (TQ, D)), 1e-3 * _normal(rng, (TK, D))  # any scale
  out = np.asarray(scores.qk_norm(q, k, 7.0))
  assert np.all(np.abs(out) <= 7.0 + 1e-5)
  np.testing.assert_allclose(scores.qk_norm(q, q, 7.0).diagonal(), 7.0, rtol=1e-5)


def test_cosine_zero_vectors_score_zero_with_finite_gradients():
  rng = np.random.default_rng(4)
  q = _normal(rng, (TQ, D)).at[1].set(0.0)  # query 1 is the zero vector
  k = _normal(rng, (TK, D)).at[2].set(0.0)  # key 2 is the zero vector
  out = scores.cosine(q, k, beta=3.0)
  assert np.all(np.asarray(out)[1] == 0.0)
  assert np.all(np.asarray(out)[:, 2] == 0.0)
  np.testing.assert_allclose(out, COSINE_NAIVE(q, k, 3.0), rtol=1e-5, atol=1e-5)
  grads = jax.jit(jax.grad(lambda q, k: jnp.sum(scores.cosine(q, k) ** 2),
                           argnums=(0, 1)))(q, k)
  for g in grads:
    assert np.all(np.isfinite(g))
  # All-zero inputs: every score 0, every gradient finite.
  zeros = jnp.zeros((TQ, D))
  assert np.all(np.asarray(scores.cosine(zeros, zeros)) == 0.0)
  g = jax.jit(jax.grad(lambda x: jnp.sum(scores.cosine(x, x))))(zeros)
  assert np.all(np.isfinite(g))


def test_cosine_is_scale_invariant_and_bounded_by_beta():
  rng = np.random.default_rng(5)
  q, k = _normal(rng, (TQ, D)), _normal(rng, (TK, D))
  beta = _normal(rng, (TQ, 1)) ** 2  # per-query key strength [Tq, 1]
  out = scores.cosine(q, k, beta)
  np.testing.assert_allclose(scores.cosine(7.0 * q, 0.1 * k, beta), out, rtol=1e-5, atol=1e-5)
  assert np.all(np.abs(out) <= beta + 1e-6)
  np.testing.assert_allclose(out, COSINE_NAIVE(q, k, beta), rtol=1e-5, atol=1e-5)


# --- Additive: chunked path vs the one-tensor reference -----------------------


@pytest.mark.parametrize("block_elements", [1, 3 * TK * A * B])
@pytest.mark.parametrize("q_lead,k_lead", [((B,), (B,)), ((B, 1), (3,))])
def test_additive_chunked_matches_naive_values_and_gradients(block_elements, q_lead, k_lead):
  # Tq = 7 in chunks of 1 or 3 queries (per unit of leading axes); with 3
  # the last chunk is padded.
  rng = np.random.default_rng(6)
  q = _normal(rng, q_lead + (7, D))  # [..., Tq, d]
  k = _normal(rng, k_lead + (TK, D))  # [..., Tk, d]
  w_q, w_k, v = _normal(rng, (D, A)), _normal(rng, (D, A)), _normal(rng, (A,))
  args = (q, k, w_q, w_k, v)
  chunked = lambda *a: scores.additive(*a, block_elements=block_elements)
  np.testing.assert_allclose(chunked(*args), scores.additive_naive(*args),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(chunked(*args), ADDITIVE_NAIVE(*args), rtol=1e-5, atol=1e-5)

  cotangent = _normal(rng, np.broadcast_shapes(q_lead, k_lead) + (7, TK))

  def loss(f):
    return lambda *a: jnp.sum(f(*a) * cotangent)

  got = jax.jit(jax.grad(loss(chunked), argnums=range(5)))(*args)
  want = jax.jit(jax.grad(loss(scores.additive_naive), argnums=range(5)))(*args)
  for name, g, w in zip(("q", "k", "w_q", "w_k", "v"), got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_additive_chunked_path_really_chunks():
  # With a tiny block the program must contain a loop over query chunks, and
  # with the default block (small problem) it must not.
  rng = np.random.default_rng(7)
  args = case("additive:function", rng).args
  small = jax.make_jaxpr(lambda *a: scores.additive(*a, block_elements=TK * A))(*args)
  default = jax.make_jaxpr(scores.additive)(*args)
  assert "scan" in str(small)
  assert "scan" not in str(default)


def _fwd_bwd_temp_bytes(fn, b, t, d, a):
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  args = (spec(b, t, d), spec(b, t, d), spec(d, a), spec(d, a), spec(a))
  loss = lambda *xs: jnp.sum(fn(*xs))
  compiled = jax.jit(jax.value_and_grad(loss, argnums=range(5))).lower(*args).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_additive_forward_backward_memory_is_chunked():
  # The measured configuration (batch 32, Tq = Tk = 128, dq = dk = 64, a = 1024,
  # float32); only compiled, never run. The naive program keeps the whole
  # [32, 128, 128, 1024] tanh tensor (2 GiB) alive for the backward pass.
  b, t, d, a = 32, 128, 64, 1024
  naive = _fwd_bwd_temp_bytes(scores.additive_naive, b, t, d, a)
  chunked = _fwd_bwd_temp_bytes(scores.additive, b, t, d, a)
  assert naive >= b * t * t * a * 4  # the measurement sees the tanh tensor
  assert chunked <= naive / 8, (chunked, naive)


# --- jit / vmap / grad for every score ----------------------------------------


@pytest.mark.parametrize("case_id", CASES)
def test_jit_equals_eager(case_id):
  c = case(case_id, np.random.default_rng(8))
  fn, args = c.fn, c.args
  np.testing.assert_allclose(jax.jit(fn)(*args), fn(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case_id", FREE_LEAD)
def test_vmap_equals_python_loop(case_id):
  c = case(case_id, np.random.default_rng(9))
  fn, args = c.fn, c.args
  # Map over the batch axis of q and k; weights / beta are shared.
  in_axes = (0, 0) + (None,) * (len(args) - 2)
  mapped = jax.vmap(fn, in_axes=in_axes)(*args)
  looped = jnp.stack([fn(args[0][i], args[1][i], *args[2:]) for i in range(B)])
  np.testing.assert_allclose(mapped, looped, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case_id", CASES)
def test_grad_is_finite_and_matches_finite_differences(case_id):
  c = case(case_id, np.random.default_rng(10))
  fn, args = c.fn, c.args
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), argnums=range(len(args))))(
      *args)
  for g, a in zip(grads, args):
    assert g.shape == a.shape
    assert np.all(np.isfinite(g))
  # Directional derivative against a central difference, in float64 numpy terms.
  rng = np.random.default_rng(11)
  direction = [rng.normal(size=np.shape(a)).astype(np.float32) for a in args]
  # The central difference's own error grows as eps²: at 1e-2 it was 2.5% for
  # general's per-head form (a W per head), at 3e-3 it is under 0.3% for every form.
  eps = 3e-3
  plus = jax.jit(fn)(*[a + eps * u for a, u in zip(args, direction)])
  minus = jax.jit(fn)(*[a - eps * u for a, u in zip(args, direction)])
  numeric = float(jnp.sum(jnp.sin(plus)) - jnp.sum(jnp.sin(minus))) / (2 * eps)
  analytic = sum(float(jnp.sum(g * u)) for g, u in zip(grads, direction))
  assert abs(numeric - analytic) <= 2e-2 * max(1.0, abs(analytic)), (numeric, analytic)


# --- Bad input: ValueError / TypeError at trace time, naming the argument ------


@pytest.mark.parametrize("fn", [s.function for s in registry.SCORES.values()
                                if s.same_dim and s.function], ids=lambda f: f.__name__)
def test_feature_size_mismatch(fn, raises_at_trace):
  q, k = np.zeros((2, 5, 3), np.float32), np.zeros((2, 6, 4), np.float32)
  raises_at_trace(fn, (q, k), ValueError, "`q`", "`k`", "(2, 5, 3)", "(2, 6, 4)")


@pytest.mark.parametrize("fn", [scores.dot, scores.scaled_dot])
def test_rank_too_small(fn, raises_at_trace):
  raises_at_trace(fn, (np.zeros(4, np.float32), np.zeros((6, 4), np.float32)),
                  ValueError, "`q`", "(4,)")
  raises_at_trace(fn, (np.zeros((5, 4), np.float32), np.zeros(4, np.float32)),
                  ValueError, "`k`", "(4,)")


def test_leading_axes_must_broadcast(raises_at_trace):
  q, k = np.zeros((2, 5, 4), np.float32), np.zeros((3, 6, 4), np.float32)
  raises_at_trace(scores.dot, (q, k), ValueError, "q (leading axes)", "k (leading axes)",
                  "(2,)", "(3,)")


def test_general_wrong_w_shape(raises_at_trace):
  q, k = np.zeros((5, 3), np.float32), np.zeros((6, 4), np.float32)
  raises_at_trace(scores.general, (q, k, np.zeros((4, 3), np.float32)),
                  ValueError, "`w`", "(3, 4)", "(4, 3)")
  raises_at_trace(scores.general, (q, k, np.zeros((12,), np.float32)),
                  ValueError, "`w`", "(12,)")


@pytest.mark.parametrize("fn", [scores.additive, scores.additive_naive])
def test_additive_wrong_weight_shapes(fn, raises_at_trace):
  q, k = np.zeros((5, 3), np.float32), np.zeros((6, 4), np.float32)
  w_q, w_k, v = np.zeros((3, 8), np.float32), np.zeros((4, 8), np.float32), np.zeros(8, np.float32)
  z = lambda *s: np.zeros(s, np.float32)
  raises_at_trace(fn, (q, k, z(4, 8), w_k, v), ValueError, "`w_q`", "(4, 8)")
  raises_at_trace(fn, (q, k, w_q, z(3, 8), v), ValueError, "`w_k`", "(3, 8)")
  raises_at_trace(fn, (q, k, z(3), w_k, v), ValueError, "`w_q`", "(3,)")
  raises_at_trace(fn, (q, k, w_q, z(4, 7), v), ValueError, "`w_k [dk, a]`", "(3, 8)", "(4, 7)")
  raises_at_trace(fn, (q, k, w_q, w_k, z(7)), ValueError, "`v [a]`", "(7,)")
  raises_at_trace(fn, (q, k, w_q, w_k, z(8, 1)), ValueError, "`v [a]`", "(8, 1)")


def test_cosine_beta_must_broadcast_to_scores(raises_at_trace):
  q, k = np.zeros((5, 4), np.float32), np.zeros((6, 4), np.float32)
  raises_at_trace(scores.cosine, (q, k, np.ones((3, 1), np.float32)),
                  ValueError, "`beta`", "(3, 1)", "(5, 6)")


def test_bad_input_under_jit_is_a_python_error_not_xla():
  # The same check fires when jit traces concrete arguments.
  q, k = jnp.zeros((2, 5, 3)), jnp.zeros((2, 6, 4))
  with pytest.raises(ValueError, match="`q` and `k`"):
    jax.jit(scores.dot)(q, k)


@pytest.mark.parametrize("size", [1e30, 1e20, 1.0, 1e-3])
def test_cosine_is_scale_safe(size):
  # squares of 1e20 and 1e30 overflow float32; cosine must not care
  q = jnp.full((1, 3), size, jnp.float32)
  k = jnp.asarray([[size, size, size], [size, -size, 0.0]], jnp.float32)
  out = np.asarray(scores.cosine(q, k))
  np.testing.assert_allclose(out, [[1.0, 0.0]], atol=1e-6)


def test_cosine_of_tiny_vectors_keeps_the_norm_clamp():
  # below the 1e-6 norm clamp the vector is divided by 1e-6, not normalised
  q = jnp.full((1, 4), 1e-9, jnp.float32)
  np.testing.assert_allclose(np.asarray(scores.cosine(q, q)), [[4e-6]], rtol=1e-5)


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "cosine"])
def test_integer_inputs_are_promoted_to_float32(name):
  q = np.array([[1, 2], [3, 4]], np.int32)
  k = np.array([[1, 0], [2, 1]], np.int32)
  out = getattr(scores, name)(q, k)
  want = getattr(scores, name)(q.astype(np.float32), k.astype(np.float32))
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6)
  assert np.abs(np.asarray(out)).min() > 0  # no truncation to int (int inputs once gave zeros)


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "cosine", "general"])
def test_empty_feature_axis_is_a_named_error(name, raises_at_trace):
  args = [np.ones((2, 0), np.float32), np.ones((3, 0), np.float32)]
  if name == "general":
    args.append(np.ones((0, 0), np.float32))
  raises_at_trace(getattr(scores, name), args, ValueError, "`q`", "empty feature axis",
                  "(2, 0)")


# Under bfloat16 compute the multiplicative arms' logits stay float32: at a = 1024
# with unit-normal projections (|logit| up to ~140), rounding the products to
# bf16 moved them by up to 0.33 (measured on CPU, commit of this test); float32
# accumulation of the same bf16 operands is within 1e-4 of float64.
@pytest.mark.parametrize("name,scale", [("dot", 1.0), ("scaled_dot", 1024 ** -0.5),
                                        ("inverse_dim", 1.0 / 1024)])
def test_bf16_products_of_large_dims_are_float32_logits(name, scale):
  a = 1024
  kq, kk = jax.random.split(jax.random.PRNGKey(0))
  q = jax.random.normal(kq, (4, 16, a)).astype(jnp.bfloat16)
  k = jax.random.normal(kk, (4, 24, a)).astype(jnp.bfloat16)
  out = getattr(scores, name)(q, k)
  assert out.dtype == jnp.float32
  exact = np.einsum("bqd,bkd->bqk", np.asarray(q, np.float64), np.asarray(k, np.float64)) * scale
  assert np.abs(exact).max() > 100 * scale  # large logits: the regime that matters
  err = np.abs(np.asarray(out, np.float64) - exact).max()
  assert err <= 1e-4 * max(1.0, np.abs(exact).max() / 100)
  # what bf16 products would have given: the error the float32 logits remove
  rounded = np.asarray((jnp.asarray(exact, jnp.float32)).astype(jnp.bfloat16), np.float64)
  assert np.abs(rounded - exact).max() > 100 * err


def test_bf16_multiplicative_layer_scores_are_float32_and_masked_logits_stay_finite():
  from flax import nnx
  from attention_jax import layers
  a = 1024
  attn = layers.Attention(64, 64, score="multiplicative", attention_dim=a,
                          dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  attn32 = layers.Attention(64, 64, score="multiplicative", attention_dim=a,
                            dtype=jnp.float32, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 64)) * 4
  keys = jax.random.normal(jax.random.PRNGKey(2), (2, 7, 64)) * 4
  mask = jnp.arange(7)[None, None, :] < jnp.asarray([7, 0])[:, None, None]  # row 2: no key
  ctx, weights, raw = attn(x, attn.prepare(keys), keys, mask=mask)
  _, _, raw32 = attn32(x, attn32.prepare(keys), keys, mask=mask)
  assert raw.dtype == jnp.float32 and weights.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(weights))) and np.all(np.isfinite(np.asarray(ctx, np.float32)))
  assert np.all(np.asarray(weights)[1] == 0)
  # the difference left is the bf16 projections', not a rounding of the products
  rel = np.abs(np.asarray(raw) - np.asarray(raw32)).max() / np.abs(np.asarray(raw32)).max()
  assert rel < 2e-2
