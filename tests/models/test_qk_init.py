"""The initialisation of the attention query/key projections, `qk_init`
(`layers.QK_INITS`, `MultiHeadAttention`, `TransformerConfig`, the flag of
`sweep.config.ExperimentConfig`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.layers import GLOROT, MultiHeadAttention
from attention_jax.models import Transformer, TransformerConfig
from attention_jax.sweep import config as config_lib

D, H = 128, 2  # d_model and heads of the premise's measurements
DKS = (16, 64, 256)  # per-head query/key sizes d_k


def _flat_params(module) -> dict:
  """{path: float64 array} of every parameter of `module`."""
  return {path: np.asarray(v[...], np.float64)
          for path, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def _transformer(qk_init=None, **overrides):
  kw = dict(vocab_size=50, num_layers=2, d_model=32, num_heads=2, d_ff=64, max_length=16,
            score="dot", pre_layer_norm=True)
  kw.update(overrides)
  if qk_init is not None:
    kw["qk_init"] = qk_init
  return Transformer(TransformerConfig(**kw), rngs=nnx.Rngs(0))


def _is_qk_kernel(path) -> bool:
  return path[-2:] in (("query", "kernel"), ("key", "kernel"))


def _layer_norm_inputs(seed=0):
  """`[8, 64, D]` what a pre-LN attention sees: the outputs of a LayerNorm at
  init (scale 1, bias 0: zero mean and unit mean square per vector) of
  standard-normal vectors."""
  x = np.random.default_rng(seed).standard_normal((8, 64, D))
  x -= x.mean(-1, keepdims=True)
  return jnp.asarray(x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6), jnp.float32)


def _mha(qk_init, d_k):
  """The layer of the measurements, its score the unscaled `dot` (q·k)."""
  return MultiHeadAttention(H, D, qk_features=d_k, score="dot", qk_init=qk_init,
                            rngs=nnx.Rngs(0))


# -- the default is the model as it was ------------------------------------------


def test_the_default_builds_the_parameters_every_run_so_far_was_built_with():
  # MultiHeadAttention as it was built before `qk_init`: four Glorot Linears
  # (query, key, value, out) drawn in that order from the same stream.
  rngs = nnx.Rngs(3)
  old = [nnx.Linear(n_in, n_out, kernel_init=GLOROT, rngs=rngs)
         for n_in, n_out in ((D, H * 16), (D, H * 16), (D, H * 32), (H * 32, D))]
  new = _flat_params(MultiHeadAttention(H, D, qk_features=16, v_features=32,
                                        rngs=nnx.Rngs(3)))
  for name, linear in zip(("query", "key", "value", "out"), old):
    np.testing.assert_array_equal(new[(name, "kernel")], linear.kernel[...])
    np.testing.assert_array_equal(new[(name, "bias")], linear.bias[...])
  # The Transformer: the default and an explicit 'glorot', leaf for leaf.
  default, glorot = _flat_params(_transformer()), _flat_params(_transformer("glorot"))
  assert default.keys() == glorot.keys()
  for path in default:
    np.testing.assert_array_equal(default[path], glorot[path], err_msg=str(path))
  assert TransformerConfig(vocab_size=50).qk_init == "glorot"
  assert config_lib.ExperimentConfig().qk_init == "glorot"


@pytest.mark.parametrize("qk_init", ["premise", "zero_query"])
def test_only_the_query_and_key_kernels_change_and_every_other_draw_is_the_same(qk_init):
  # nnx.Rngs draws one key per parameter whatever the initialiser does with it
  # (zeros ignores its key), so every other parameter is drawn as before.
  base, other = _flat_params(_transformer("glorot")), _flat_params(_transformer(qk_init))
  assert base.keys() == other.keys()
  changed = {path for path in base if not np.array_equal(base[path], other[path])}
  qk = {path for path in base if _is_qk_kernel(path)}
  # Every W_Q and W_K of every attention: encoder self, decoder self and cross.
  assert len(qk) == 2 * (2 + 2 * 2)
  assert changed == qk


# -- premise: the footnote's premise at step 0 ------------------------------------


def _query_variance(qk_init, d_k) -> float:
  """The variance of a query coordinate over positions, averaged over the
  H·d_k coordinates, on pre-LN inputs."""
  q = _mha(qk_init, d_k).project_query(_layer_norm_inputs())  # [B, H, T, d_k]
  return float(np.mean(np.var(np.asarray(q, np.float64), axis=(0, 2))))


def test_premise_gives_unit_variance_queries_at_every_d_k_and_glorot_does_not():
  premise = {d_k: _query_variance("premise", d_k) for d_k in DKS}
  for d_k, var in premise.items():
    assert var == pytest.approx(1.0, rel=0.15), (d_k, premise)
  # Glorot: variance fan_in · 2 / (fan_in + fan_out) = 256 / (128 + 2·d_k):
  # 1.6, 1.0, 0.4 at d_k 16, 64, 256.
  glorot = {d_k: _query_variance("glorot", d_k) for d_k in DKS}
  assert glorot[16] > glorot[64] > glorot[256]
  assert glorot[16] / glorot[256] > 3.0, glorot


def test_premise_makes_the_unscaled_dot_logits_grow_like_the_root_of_d_k():
  x = _layer_norm_inputs()
  stds = []
  for d_k in DKS:
    mha = _mha("premise", d_k)
    k, _ = mha.project_kv(x)
    logits = mha.scores(mha.project_query(x), k)  # [B, H, T, S], the `dot` score: q·k
    stds.append(float(np.std(np.asarray(logits, np.float64))))
  slope = np.polyfit(np.log(DKS), np.log(stds), 1)[0]
  assert slope == pytest.approx(0.5, abs=0.1), stds
  for d_k, std in zip(DKS, stds):  # q·k of d_k products of unit variance
    assert std / np.sqrt(d_k) == pytest.approx(1.0, rel=0.25), (d_k, stds)


def test_post_ln_premise_queries_follow_the_mean_square_of_their_inputs():
  # The docstring's account of post-LN: the first layer's self attention sees
  # embeddings·√d_model + positions (mean square ~1.5), the next a LayerNorm
  # output (1), so its query coordinates have mean square ~1.5, then ~1.
  model = _transformer("premise", vocab_size=1000, d_model=D, num_heads=H,
                       attention_dim=64, max_length=64, pre_layer_norm=False)
  src = jax.random.randint(jax.random.key(1), (8, 64), 3, 1000)
  x = model._embed(src, model.embed)  # [B, S, D]
  first = model.encoder_layers[0]
  second_input = first(x, None)
  mean_square = lambda a: float(np.mean(np.square(np.asarray(a, np.float64))))
  assert mean_square(x) == pytest.approx(1.5, rel=0.1)
  assert mean_square(first.self_attn.project_query(x)) == pytest.approx(1.5, rel=0.15)
  second = model.encoder_layers[1].self_attn.project_query(second_input)
  assert mean_square(second) == pytest.approx(1.0, rel=0.15)


# -- zero_query: every logit 0 at step 0 ------------------------------------------


def test_zero_query_starts_every_logit_at_zero():
  mha = _mha("zero_query", 64)
  assert not np.any(np.asarray(mha.query.kernel[...]))
  assert np.std(np.asarray(mha.key.kernel[...])) == pytest.approx(D ** -0.5, rel=0.1)
  x = _layer_norm_inputs()
  _, aux = mha(x, return_weights=True)
  assert not np.any(np.asarray(aux["scores"]))
  # In the Transformer: the W_Q of every attention (their biases start at zero
  # under every `qk_init`, as the layer's logits above show).
  model = _transformer("zero_query")
  queries = [v for path, v in _flat_params(model).items() if path[-2:] == ("query", "kernel")]
  assert len(queries) == 6 and not any(np.any(q) for q in queries)


# -- a bad value -------------------------------------------------------------------


def test_a_bad_value_is_one_error_naming_qk_init_before_any_work():
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match=r"^`qk_init` must be one of \('glorot', 'premise', "
                     r"'zero_query'\), got 'xavier'\.$"):
    MultiHeadAttention(H, D, qk_init="xavier", rngs=rngs)
  assert int(rngs.params.count[...]) == 0  # nothing was drawn
  with pytest.raises(ValueError, match=r"^`qk_init` must be one of .*got 'xavier'\.$"):
    TransformerConfig(vocab_size=50, qk_init="xavier")
  # The flag: checked by the model config it makes, the error naming the flag.
  with pytest.raises(ValueError) as info:
    config_lib.from_preset("transformer_smoke", qk_init="xavier")
  message = str(info.value)
  assert "`qk_init` must be one of" in message and "\n" not in message, message
  assert message.startswith("--model=transformer, arm "), message
  # A Transformer flag: given to the RNN, it is refused naming it.
  with pytest.raises(ValueError, match="`qk_init` applies only to the Transformer"):
    config_lib.check_family("rnn", {"qk_init": "premise"})

