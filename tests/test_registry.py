"""The score registry is the one list: every derived list and every layer agree with it."""

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import layers, registry, scores
from attention_jax import score_kinds as kinds
from attention_jax.attention import select_implementation
from attention_jax.measure import flops
from attention_jax.sweep import config


def test_derived_lists_follow_the_registry():
  assert layers.SCORES == tuple(registry.SCORES)
  assert registry.FUNCTION_SCORES == tuple(n for n, s in registry.SCORES.items() if s.function)
  assert config.ARMS == tuple(registry.SCORES) + registry.NO_ATTENTION_ARMS
  for spec in registry.SCORES.values():  # fused names are scores the fused kernels compute
    assert spec.fused is None or registry.SCORES[spec.fused].fusable
    assert (spec.dot_product is None) or spec.function is not None
    # every parameter a pure function requires is a named parameter of it
    for param in spec.function_params + spec.function_options:
      assert param in inspect.signature(spec.function).parameters, (spec.name, param)


def _shapes(module, names):
  state = nnx.to_pure_dict(nnx.state(module))
  return {n: jax.tree.map(lambda x: tuple(x.shape), state[n]) for n in names}


def _made_shapes(form, dims):
  """Shapes of what `form.make_params` makes for `dims` (a module: the shapes
  of its parameters), by name."""
  shapes = {}
  for name, p in form.make_params(dims, nnx.Rngs(0)).items():
    tree = p[...] if isinstance(p, nnx.Variable) else nnx.to_pure_dict(nnx.state(p))
    shapes[name] = jax.tree.map(lambda x: tuple(x.shape), tree)
  return shapes


# The score's own parameters (beyond the projections) in each layer are what
# its form makes for the layer's sizes, under the names it gives them: those
# are the paths of the layers' state, which checkpoints are read by.
@pytest.mark.parametrize("name", registry.LAYER_SCORES)
def test_each_layer_has_exactly_the_parameters_of_its_form(name):
  spec = registry.SCORES[name]
  layer = layers.Attention(6, 6, score=name, attention_dim=5, max_source_length=9,
                           rngs=nnx.Rngs(0))
  own = set(nnx.state(layer)) - {"query_proj", "key_proj"}
  assert hasattr(layer, "query_proj") == hasattr(layer, "key_proj") == spec.projected
  want = _made_shapes(spec.rnn, kinds.Dims(6, 6, 5, 9))
  assert set(layer.score_params) == own == set(want)
  assert _shapes(layer, own) == want
  mha = layers.MultiHeadAttention(2, 8, score=name, max_length=9, rngs=nnx.Rngs(0))
  own = set(nnx.state(mha)) - {"query", "key", "value", "out"}
  want = _made_shapes(spec.mha, kinds.Dims(4, 4, 4, 9, heads=2))
  assert set(mha.score_params) == own == set(want)
  assert _shapes(mha, own) == want
  if spec.needs_length:  # a parameter's shape or initial value follows the length
    longer = _made_shapes(spec.rnn, kinds.Dims(6, 6, 5, 17))
    assert longer != want or any(
        not np.array_equal(a[...], b[...]) for a, b in zip(
            jax.tree.leaves(spec.rnn.make_params(kinds.Dims(6, 6, 5, 9), nnx.Rngs(0))),
            jax.tree.leaves(spec.rnn.make_params(kinds.Dims(6, 6, 5, 17), nnx.Rngs(0)))))


def test_every_entry_carries_its_references_and_what_it_logs():
  """What the tests, the benchmark and the diagnostics read of an entry is there:
  a NumPy reference of both forms, a naive form for every pure function, and
  every logged parameter one that its forms make."""
  for name, spec in registry.SCORES.items():
    assert spec.rnn.reference is not None and spec.mha.reference is not None, name
    assert (spec.naive is not None) == (spec.function is not None), name
    made = set(spec.rnn.make_params(kinds.Dims(6, 6, 5, 9), nnx.Rngs(0))) | set(
        spec.mha.make_params(kinds.Dims(4, 4, 4, 9, heads=2), nnx.Rngs(0)))
    assert set(spec.logged_params) <= made, name
  assert dict(registry.SCORES["qk_norm"].logged_params) == {"g": "qk_norm_g"}
  assert [n for n, s in registry.SCORES.items() if s.per_position] == ["location"]


@pytest.mark.parametrize("name", registry.LAYER_SCORES)
def test_rnn_attention_layer_checks_what_the_registry_says(name):
  spec = registry.SCORES[name]
  if spec.same_dim:
    with pytest.raises(ValueError, match="query_dim == key_dim"):
      layers.Attention(6, 8, score=name, rngs=nnx.Rngs(0))
  else:
    layers.Attention(6, 8, score=name, attention_dim=4, max_source_length=5,
                     rngs=nnx.Rngs(0))
  if spec.needs_length:
    with pytest.raises(ValueError, match="max_source_length"):
      layers.Attention(6, 6, score=name, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", [n for n, s in registry.SCORES.items() if s.fused])
def test_fused_scores_give_the_plain_result_in_the_multi_head_layer(name):
  mha = layers.MultiHeadAttention(2, 8, score=name, rngs=nnx.Rngs(0))
  t = 512  # long enough that `auto` hands the heads to the blockwise kernel on CPUs
  x = jax.random.normal(jax.random.key(1), (2, t, 8))
  mask = jnp.arange(t)[None, None, None, :] < jnp.asarray([t, 300])[:, None, None, None]
  q, (k, v) = mha.project_query(x), mha.project_kv(x)
  fused = registry.SCORES[name].fused
  expected_kernel = "blockwise" if jax.default_backend() == "cpu" else "fused"
  assert select_implementation(fused, "auto", q, k, v) == expected_kernel
  assert select_implementation(fused, "auto", q, k, v, return_weights=True) == "plain"
  handed_over, _ = mha(x, mask=mask)  # no weights asked: attention() computes it
  own, aux = mha(x, mask=mask, return_weights=True)  # the layer's own scores
  np.testing.assert_allclose(handed_over, own, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(aux["scores"], getattr(scores, fused)(q, k), rtol=1e-5, atol=1e-5)


def test_unknown_score_names_the_field():
  with pytest.raises(ValueError, match="`arms` must be one of"):
    registry.get("bogus", "arms")
  with pytest.raises(ValueError, match="`score`"):
    layers.MultiHeadAttention(2, 8, score="bogus", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name,decoder,score", [
    ("additive", "luong", "additive"),
    ("scaled_multiplicative", "luong", "scaled_multiplicative"),
    ("none_init", "none_init", None),
    ("none_concat", "none_concat", None),
])
def test_an_arm_is_resolved_once_into_decoder_and_score(name, decoder, score):
  arm = config.Arm.of(name, 64)
  assert (arm.decoder, arm.score, arm.attention_dim) == (decoder, score, 64)
  assert arm.has_attention == (score is not None)
  assert arm.label == f"{name} d=64"
  sweep = config.from_preset("smoke", arms=("additive", "multiplicative"), dims=(8, 32)).sweep()
  assert [(a.name, a.attention_dim) for a in sweep] == [
      ("additive", 8), ("additive", 32), ("multiplicative", 8), ("multiplicative", 32)]


def test_every_entry_hashes_as_the_static_graph_data_it_is():
  """Layers keep their score's entry as static data, which JAX hashes when
  it compiles a model's GraphDef: a dict field made it unhashable and broke
  `nnx.jit` of whole models (experiments/init_logits/run.py)."""
  for name in registry.SCORES:
    entry = registry.get(name)
    assert hash(entry) == hash(registry.get(name)), name


# The sizes of the cost checks below: all distinct, so that no other product
# can count as the one product B·H·Tq·Tk·d.
_B, _H, _TQ, _TK, _D, _L = 2, 3, 4, 5, 7, 11


def _form_inputs(spec, layer):
  """`(logits, q, k)` of the entry's `layer` form on random inputs: the heads
  on axis 1 for 'mha', every size `_D` (a projected score's a too)."""
  form = getattr(spec, layer)
  heads = _H if layer == "mha" else None
  made = form.make_params(kinds.Dims(_D, _D, _D, max_length=_L, heads=heads), nnx.Rngs(0))
  params = {n: p[...] if isinstance(p, nnx.Variable) else p for n, p in made.items()}
  lead = (_B, _H)
  q = jax.random.normal(jax.random.key(1), lead + (_TQ, _D))
  k = jax.random.normal(jax.random.key(2), lead + (_TK, _D))
  return (lambda q, k: form.logits(q, k, **params)), q, k


def _values(fn, *args):
  """Every value `fn`'s jaxpr computes (its sub-jaxprs' too), by shape."""
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      yield from (v.aval.shape for v in eqn.outvars)
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            yield from walk(inner)
  return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


@pytest.mark.parametrize("name", registry.LAYER_SCORES)
def test_one_product_is_what_the_layer_forms_cost(name):
  """`one_product`: the logits of both forms cost exactly the matrix-product
  FLOPs of q·kᵀ (what the Transformer's hand count assumes)."""
  spec = registry.SCORES[name]
  one = 2 * _B * _H * _TQ * _TK * _D
  counts = [flops.count(*_form_inputs(spec, layer)).matmul for layer in ("rnn", "mha")]
  assert all(c == one for c in counts) == spec.one_product, counts


@pytest.mark.parametrize("name", registry.LAYER_SCORES)
def test_pair_block_is_a_value_per_query_key_pair_and_feature(name):
  """`pair_block`: a form's logits compute a value of Tq·Tk·a elements per
  head (additive's tanh block); no other score's forms do."""
  spec = registry.SCORES[name]
  block = _TQ * _TK * _D
  for layer in ("rnn", "mha"):
    biggest = max(math.prod(s) for s in _values(*_form_inputs(spec, layer)))
    assert (biggest >= _B * _H * block) == spec.pair_block, (layer, biggest)


def test_fusable_scores_are_their_own_fused_score():
  for name, spec in registry.SCORES.items():
    assert spec.fusable == (spec.fused == name)
  assert [n for n, s in registry.SCORES.items() if s.fusable] == ["dot", "scaled_dot"]
