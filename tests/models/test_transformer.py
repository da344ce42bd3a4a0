"""Tests for attention_jax.models.transformer."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import layers as layers_lib
from attention_jax.layers import SCORES
from attention_jax.models import Transformer, TransformerConfig, count_params, create_ensemble
from attention_jax.models import transformer
from attention_jax.training import diagnostics
from tests.models import synthetic_task
from tests.models.synthetic_task import encode, forward

V = 23
SRC = np.array([[5, 6, 7, 8, 1, 0, 0], [9, 10, 1, 0, 0, 0, 0]], np.int32)  # [2, 7]
TGT_IN = np.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]], np.int32)  # [2, 5]


def small(**overrides):
  kw = dict(vocab_size=V, num_layers=2, d_model=16, num_heads=4, d_ff=32, dropout=0.1,
            max_length=16)
  kw.update(overrides)
  return TransformerConfig(**kw)


CONFIGS = {
    "post_ln": small(),
    "pre_ln_learned_unshared_additive": small(pre_layer_norm=True, positional="learned",
                                              share_embeddings=False, score="additive"),
    "location_general_dim": small(score="location", attention_dim=6),
}



def model_of(config, seed=0):
  return Transformer(config, rngs=nnx.Rngs(seed))


# -- configuration -------------------------------------------------------------


@pytest.mark.parametrize("field, value, fragment", [
    ("num_heads", 5, "`d_model` (16) must be divisible by `num_heads` (5)"),
    ("score", "bilinear", "`score` must be one of"),
    ("positional", "rope", "`positional` must be one of"),
    ("dropout", 1.5, "`dropout` must be a float in [0, 1)"),
    ("dtype", jnp.int32, "`dtype` must be one of"),
    ("num_layers", 0, "`num_layers` must be a positive int"),
    ("eos_id", 23, "`eos_id` must be an int in [0, vocab_size=23)"),
    ("sos_id", 1, "must differ"),
])
def test_config_rejects_bad_fields(field, value, fragment):
  with pytest.raises(ValueError) as info:
    small(**{field: value})
  assert fragment in str(info.value)


def test_config_base_is_vaswani_base_and_frozen():
  c = TransformerConfig.base(8000)
  assert (c.num_layers, c.d_model, c.num_heads, c.d_ff, c.dropout, c.head_dim) == (
      6, 512, 8, 2048, 0.1, 64)
  assert (c.positional, c.pre_layer_norm, c.share_embeddings) == ("sinusoidal", False, True)
  assert TransformerConfig.base(8000, num_layers=2).num_layers == 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.d_model = 3


def expected_params(c: TransformerConfig) -> int:
  """Closed-form parameter count (all Linear layers have a bias)."""
  d, f, h, v, dk = c.d_model, c.d_ff, c.num_heads, c.vocab_size, c.head_dim
  dv = d // h
  mha = 2 * (d * h * dk + h * dk) + (d * h * dv + h * dv) + (h * dv * d + d)
  mha += {"additive": 2 * h * dk * dk + h * dk, "general": h * dk * dk, "cosine": h,
          "location": h * dk * c.max_length + h * c.max_length}.get(c.score, 0)
  ffn = d * f + f + f * d + d
  layer_norm = 2 * d
  encoder = c.num_layers * (mha + ffn + 2 * layer_norm)
  decoder = c.num_layers * (2 * mha + ffn + 3 * layer_norm)
  embeddings = v * d if c.share_embeddings else 3 * v * d  # src, tgt, output (no bias)
  positions = c.max_length * d if c.positional == "learned" else 0
  final_norms = 2 * layer_norm if c.pre_layer_norm else 0
  return embeddings + positions + encoder + decoder + final_norms


@pytest.mark.parametrize("config", [
    TransformerConfig.base(8000),
    *CONFIGS.values(),
    small(score="general", attention_dim=8), small(score="cosine"),
], ids=["base", *CONFIGS, "general", "cosine"])
def test_parameter_count_matches_closed_form(config):
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  assert count_params(model) == expected_params(config)
  if config.d_model == 512:  # Transformer-base with an 8k vocabulary
    assert expected_params(config) == 48_234_496


# -- forward pass --------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_shapes_and_cross_attention(name):
  c = CONFIGS[name]
  logits, aux = forward(model_of(c), SRC, TGT_IN)
  assert logits.shape == (2, 5, V) and logits.dtype == jnp.float32
  assert aux["scores"].shape == aux["weights"].shape == (2, 2, 4, 5, 7)  # [N, B, H, T, S]
  assert aux["key_valid"].shape == (1, 2, 1, 1, 7)
  np.testing.assert_array_equal(aux["key_valid"][0, :, 0, 0], SRC != 0)
  weights = np.asarray(aux["weights"])
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert np.all(weights[:, 1, :, :, 3:] == 0.0)  # source padding gets no weight
  assert np.all(np.isfinite(np.asarray(aux["scores"])))


def _record_fused_handovers(monkeypatch):
  """Makes every attention that needs no weights choose the fused kernel and
  records the keyword arguments of each call handed to `layers.attention`
  (computed there by its plain kernel on CPU). Returns the list of calls."""
  calls = []
  real = layers_lib.attention

  def recording(q, k, v, **kw):
    calls.append(kw)
    return real(q, k, v, **kw)

  monkeypatch.setattr(layers_lib, "attention", recording)
  monkeypatch.setattr(layers_lib, "select_implementation",
                      lambda *a, return_weights=False, **k: "plain" if return_weights else "fused")
  return calls


def test_self_attentions_pass_their_masks_as_structure(monkeypatch):
  # So that on GPUs cuDNN applies the causal and padding masks inside its fused
  # kernel (a dense mask reaches it as a bias). Handed over here (CPU: computed
  # by `attention`'s plain kernel), the logits are those of the dense masks.
  model = model_of(small(dropout=0.0))
  want, _ = model(SRC, TGT_IN)  # not the jitted `forward`: its cache would skip tracing
  calls = _record_fused_handovers(monkeypatch)
  got, _ = model(SRC, TGT_IN)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert len(calls) == 4 and all(c.get("mask") is None for c in calls)  # 2 encoder, 2 decoder
  lengths = (SRC != 0).sum(-1)
  for c in calls[:2]:  # encoder: padded sources, both ways
    assert not c["causal"]
    np.testing.assert_array_equal(c["query_lengths"], lengths)
    np.testing.assert_array_equal(c["key_lengths"], lengths)
  for c in calls[2:]:  # decoder: causal, padded targets as keys
    assert c["causal"] and c["query_lengths"] is None
    np.testing.assert_array_equal(c["key_lengths"], (TGT_IN != 0).sum(-1))


def test_a_sentence_ends_at_its_first_pad():
  # The convention that lets the self attentions pass lengths: what follows a pad
  # inside a row is padding too, in the dense masks as in the lengths.
  model = model_of(small())
  src = SRC.copy()
  src[0, 2] = 0  # [5, 6, 0, 8, 1, 0, 0]
  tgt = TGT_IN.copy()
  tgt[0, 2] = 0  # [2, 11, 0, 13, 14]
  cut_src, cut_tgt = src.copy(), tgt.copy()
  cut_src[0, 2:], cut_tgt[0, 2:] = 0, 0
  got, aux = forward(model, src, tgt)
  want, _ = forward(model, cut_src, cut_tgt)
  np.testing.assert_allclose(got[:, :2], want[:, :2], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(aux["key_valid"][0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decoder_is_causal(name):
  model = model_of(CONFIGS[name])
  logits, _ = forward(model, SRC, TGT_IN)
  for t in range(4):
    changed = TGT_IN.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 5) % V
    new, _ = forward(model, SRC, changed)
    np.testing.assert_allclose(new[:, :t + 1], logits[:, :t + 1], rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(new[:, t + 1:] - logits[:, t + 1:]))) > 1e-4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_step_decoding_reproduces_teacher_forced_logits(name):
  model = model_of(CONFIGS[name])
  logits, aux = forward(model, SRC, TGT_IN)
  memory, carry = model.init_decode(SRC, 8)
  step = jax.jit(lambda m, c, tok, t: model.decode_step(m, c, tok, t))
  for t in range(TGT_IN.shape[1]):
    step_logits, carry, weights = step(memory, carry, jnp.asarray(TGT_IN[:, t]), t)
    real = TGT_IN[:, t] != 0  # padding positions of tgt_in are not decoded
    np.testing.assert_allclose(step_logits[real], logits[real, t], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights[real], aux["weights"][-1, real, :, t].mean(1),
                               rtol=1e-5, atol=1e-6)


def test_padding_the_source_changes_nothing():
  model = model_of(CONFIGS["pre_ln_learned_unshared_additive"])
  padded = np.pad(SRC, ((0, 0), (0, 4)))
  np.testing.assert_allclose(encode(model, padded)[:, :7], encode(model, SRC),
                             rtol=1e-5, atol=1e-5)
  logits, aux = forward(model, SRC, TGT_IN)
  logits_p, aux_p = forward(model, padded, TGT_IN)
  np.testing.assert_allclose(logits_p, logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(aux_p["weights"][..., :7], aux["weights"], rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(aux_p["weights"])[..., 7:] == 0.0)


def test_bfloat16_compute_is_close_to_float32():
  c32 = small(dropout=0.0)
  m32 = model_of(c32)
  m16 = model_of(dataclasses.replace(c32, dtype=jnp.bfloat16))
  l32, a32 = forward(m32, SRC, TGT_IN)
  l16, a16 = forward(m16, SRC, TGT_IN)
  assert l16.dtype == jnp.float32 and a16["weights"].dtype == jnp.float32
  assert m16.embed.embedding[...].dtype == jnp.float32
  scale = float(jnp.max(jnp.abs(l32)))
  np.testing.assert_allclose(l16, l32, atol=0.05 * scale)
  np.testing.assert_allclose(a16["weights"], a32["weights"], atol=0.05)
  assert float(jnp.max(jnp.abs(l16 - l32))) > 0  # the bf16 path really ran


def test_dropout_uses_the_rngs_given_at_call_time():
  # Dropout on the attention weights is tested in tests/test_layers.py; here
  # it is only wired through (each dropout site costs XLA compile time).
  wired = nnx.eval_shape(lambda: model_of(small(attention_dropout=0.3)))
  assert {m.dropout_rate for l in wired.decoder_layers for m in (l.self_attn, l.cross_attn)} == {0.3}
  model = model_of(small())
  det, _ = forward(model, SRC, TGT_IN)
  with pytest.raises(ValueError, match="rngs"):
    forward(model, SRC, TGT_IN, deterministic=False)
  # Inside jit + vmap after split / merge, with the Rngs made inside the trace.
  graphdef, state = nnx.split(model)
  run = jax.jit(jax.vmap(lambda k: nnx.merge(graphdef, state)(
      SRC, TGT_IN, deterministic=False, rngs=nnx.Rngs(dropout=k))[0]))
  k0, k1 = jax.random.split(jax.random.key(0))
  out = run(jnp.stack([k0, k0, k1]))
  assert out.shape == (3, 2, 5, V)
  np.testing.assert_array_equal(out[0], out[1])  # same key, same masks
  assert float(jnp.max(jnp.abs(out[0] - out[2]))) > 1e-3
  assert float(jnp.max(jnp.abs(out[0] - det))) > 1e-3


def test_score_offset_enters_before_the_softmax_and_has_gradients():
  model = model_of(small())
  logits, aux = forward(model, SRC, TGT_IN)
  zeros = jnp.zeros(aux["scores"].shape)
  np.testing.assert_allclose(forward(model, SRC, TGT_IN, score_offset=zeros)[0], logits, atol=1e-6)
  # Constant along the key axis: the softmax does not see it.
  shift = jnp.broadcast_to(jnp.arange(5.0)[None, None, None, :, None], zeros.shape)
  np.testing.assert_allclose(forward(model, SRC, TGT_IN, score_offset=shift)[0], logits,
                             rtol=1e-5, atol=1e-5)

  graphdef, state = nnx.split(model)

  @jax.jit
  def loss(offset):
    out, _ = nnx.merge(graphdef, state)(SRC, TGT_IN, score_offset=offset)
    return jnp.sum(jax.nn.log_softmax(out)[..., 3])

  grad = np.asarray(jax.grad(loss)(zeros))  # [N, B, H, T, S]
  assert grad.shape == zeros.shape and np.abs(grad).max() > 1e-4
  assert np.all(grad[:, 1, :, :, 3:] == 0.0)  # masked keys get no gradient
  np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-5)  # softmax shift invariance
  # Finite difference along the gradient's direction u: dL/du = |grad|.
  u = grad / np.linalg.norm(grad)
  eps = 0.05
  numeric = (loss(eps * u) - loss(-eps * u)) / (2 * eps)
  np.testing.assert_allclose(numeric, np.linalg.norm(grad), rtol=2e-2)
  with pytest.raises(ValueError, match=r"score_offset.*\[N, B, H, T, S\]"):
    forward(model, SRC, TGT_IN, score_offset=jnp.zeros((2, 5, 7)))


def test_bad_inputs_raise_named_errors():
  model = model_of(small())
  with pytest.raises(ValueError, match="`src` has length 20 > config.max_length=16"):
    forward(model, np.ones((2, 20), np.int32), TGT_IN)
  with pytest.raises(ValueError, match="batch size"):
    forward(model, SRC[:1], TGT_IN)
  with pytest.raises(TypeError, match="`tgt_in` must be an integer array"):
    forward(model, SRC, TGT_IN.astype(np.float32))
  with pytest.raises(ValueError, match=r"`src` must be int tokens \[B, T\]"):
    forward(model, SRC[0], TGT_IN)
  with pytest.raises(TypeError, match="TransformerConfig"):
    Transformer({"vocab_size": 3}, rngs=nnx.Rngs(0))


def test_ensemble_of_seeds_equals_separately_built_models():
  config = small()
  seeds = [3, 0, 7]
  graphdef, states = create_ensemble(Transformer, config, seeds)
  assert count_params(states) == 3 * count_params(model_of(config))
  run = jax.jit(jax.vmap(lambda st: nnx.merge(graphdef, st)(SRC, TGT_IN)[0]))
  together = run(states)
  for i, seed in enumerate(seeds):
    alone, _ = forward(model_of(config, seed), SRC, TGT_IN)
    np.testing.assert_allclose(together[i], alone, rtol=1e-5, atol=1e-5)
  assert float(jnp.max(jnp.abs(together[0] - together[1]))) > 1e-3


@pytest.mark.slow  # 9-12 s each on the loaded 2-core Xeon (2026-11-28): as the RNN's, in `make test-all`
@pytest.mark.parametrize("name", ["post_ln", "pre_ln_learned_unshared_additive"])
def test_flattened_products_give_the_layers_own_loss_and_gradients(name, monkeypatch):
  """The attention projections, the feed-forward layers and the output layer
  (tied: `embed.attend`; untied: `output`) run as 2-D products on CPUs
  (`layers.dense`); the loss and every gradient are those of calling the
  layers on the 3-D tensors, to float32 rounding, with dropout on."""
  from attention_jax.training import steps  # pylint: disable=g-import-not-at-top

  config = CONFIGS[name]
  tgt = np.array([[11, 12, 13, 14, 1], [15, 16, 1, 0, 0]], np.int32)

  def loss_and_grads():
    def loss(m):
      logits, _ = m(SRC, TGT_IN, deterministic=False, rngs=jax.random.key(3))
      return steps.token_loss(logits, tgt, config.pad_id, label_smoothing=0.1)[0]
    # A new function each time: traced again, with `layers.dense` as it is then.
    return nnx.jit(lambda m: nnx.value_and_grad(loss)(m))(model_of(config))

  assert jax.default_backend() == "cpu"  # where `dense` flattens
  calls = []
  flatten = layers_lib.dense
  monkeypatch.setattr(layers_lib, "dense", lambda layer, x: calls.append(x.ndim) or
                      flatten(layer, x))
  flat = loss_and_grads()
  # Every product of the model goes through it, on 3-D activations: 2 encoder
  # layers x (q, k, v, out + 2 feed-forward) + 2 decoder layers x (2 x 4 + 2)
  # + the output layer.
  assert calls == [3] * 33
  monkeypatch.setattr(layers_lib, "dense", lambda layer, x: layer(x))
  synthetic_task.assert_same_loss_and_gradients(flat, loss_and_grads(), min_leaves=20)


# -- overfitting a synthetic task ------------------------------------------------

_FAST_SCORES = ("scaled_dot",)


def _copy_task(score):
  """The copy task: sentences of 5-15 symbols for the scores `make test-all`
  runs; for the default suite's score, 256 pairs of 5-8 symbols, which the
  two-layer model learned in about 150 steps instead of 250 over sentences
  twice as long (18 s against 40 s on the loaded 2-core Xeon, 2026-11-27;
  the default test now trains one layer, see its comment): the same
  property, a model that routes every symbol to its place, at half the cost."""
  if score in _FAST_SCORES:
    return synthetic_task.make_task(256, 16, task="copy", max_len=8)
  return synthetic_task.make_task(512, 16, task="copy")


@pytest.mark.parametrize("score", [
    pytest.param(s, marks=() if s in _FAST_SCORES else pytest.mark.slow) for s in SCORES])
def test_overfits_copy_task(score):
  # The default suite's score trains one layer of each stack at a learning rate
  # of 3e-3, checked every 10 steps: it copies after about 110 steps (150 with
  # two layers at 1e-3), each step with half the operations, about half the
  # CPU time (7 s against 14 s). Copying needs one layer (the cross attention
  # finds the source position of each target position); the stacking of layers
  # is checked by the forward, causality and cached-decoding tests above.
  fast = score in _FAST_SCORES
  config = TransformerConfig(16, num_layers=1 if fast else 2, d_model=64, num_heads=4,
                             d_ff=128, dropout=0.0, score=score, max_length=16)
  accuracy, steps, seconds = synthetic_task.train_to_accuracy(
      model_of(config), _copy_task(score), max_steps=2000,
      learning_rate=3e-3 if fast else 1e-3, check_every=10 if fast else 50)
  assert accuracy >= 0.99, (score, accuracy, steps, seconds)


def test_encoder_and_decoder_depths_can_differ():
  config = TransformerConfig(16, num_layers=2, encoder_layers=1, d_model=16, num_heads=2,
                             d_ff=32, dropout=0.0, max_length=16)
  model = Transformer(config, rngs=nnx.Rngs(0))
  assert (len(model.encoder_layers), len(model.decoder_layers)) == (1, 2)
  deeper = Transformer(dataclasses.replace(config, encoder_layers=3), rngs=nnx.Rngs(0))
  assert len(deeper.encoder_layers) == 3
  src = jnp.asarray([[5, 6, 7, 1]])
  logits, aux = forward(model, src, jnp.asarray([[2, 5, 6]]))
  assert logits.shape == (1, 3, 16) and aux["scores"].shape[0] == 2  # one per decoder layer
  assert len(Transformer(dataclasses.replace(config, encoder_layers=None),
                         rngs=nnx.Rngs(0)).encoder_layers) == 2  # None: num_layers
  with pytest.raises(ValueError, match="encoder_layers"):
    TransformerConfig(16, encoder_layers=0)


def test_max_logits_per_layer_and_kind_match_the_scores_by_hand():
  config = TransformerConfig(16, num_layers=2, encoder_layers=1, d_model=16, num_heads=2,
                             d_ff=32, dropout=0.0, max_length=16)
  model = Transformer(config, rngs=nnx.Rngs(3))
  pad = config.pad_id
  src = jnp.asarray([[5, 6, 7, 8, 1], [9, 10, 1, pad, pad]])  # [B, S]
  tgt = jnp.asarray([[2, 5, 6, 7], [2, 9, pad, pad]])  # [B, T]
  (logits, aux), attention = diagnostics.transformer_attention(model, src, tgt)
  plain_logits, _ = model(src, tgt)
  np.testing.assert_allclose(logits, plain_logits, rtol=1e-6, atol=1e-6)  # diagnostics only
  peaks = diagnostics.max_logits(attention)
  assert {k: v.shape for k, v in peaks.items()} == {
      "encoder_self": (1,), "decoder_self": (2,), "cross": (2,)}
  # every kind is named after one module the diagnostics can find in the params
  assert set(peaks) == set(transformer.ATTENTION_KINDS.values())
  for (layers, sublayer) in transformer.ATTENTION_KINDS:
    assert hasattr(getattr(model, layers)[0], sublayer)
  src_valid, tgt_valid = np.asarray(src != pad), np.asarray(tgt != pad)
  scores = np.asarray(aux["scores"])  # [N, B, H, T, S]
  for i in range(2):  # cross: only real (query, key) pairs count
    want = max(scores[i, b, :, t, s].max() for b in range(2) for t in range(4)
               for s in range(5) if tgt_valid[b, t] and src_valid[b, s])
    np.testing.assert_allclose(peaks["cross"][i], want, rtol=1e-6)
  # encoder self attention of layer 0, from its own scores
  x = model._embed(src, model.embed)
  _, enc_aux = model.encoder_layers[0].self_attn(x, return_weights=True)
  enc = np.asarray(enc_aux["scores"])  # [B, H, S, S]
  want = max(enc[b, :, q, k].max() for b in range(2) for q in range(5) for k in range(5)
             if src_valid[b, q] and src_valid[b, k])
  np.testing.assert_allclose(peaks["encoder_self"][0], want, rtol=1e-6)
  # decoder self attention of layer 0: causal and real positions only
  y = model._embed(tgt, model.embed)
  _, dec_aux = model.decoder_layers[0].self_attn(y, return_weights=True)
  dec = np.asarray(dec_aux["scores"])  # [B, H, T, T]
  want = max(dec[b, :, q, k].max() for b in range(2) for q in range(4) for k in range(q + 1)
             if tgt_valid[b, q] and tgt_valid[b, k])
  np.testing.assert_allclose(peaks["decoder_self"][0], want, rtol=1e-6)
  # what the modules sowed is what the model computed: the cross attention's
  # scores and weights are also the model's outputs, and every module's
  # weights are the softmax of its scores over the real keys
  for i, a in enumerate(attention["cross"]):
    np.testing.assert_array_equal(a["scores"], aux["scores"][i])
    np.testing.assert_array_equal(a["weights"], aux["weights"][i])
  for kind, modules in attention.items():
    for a in modules:
      scores = np.asarray(a["scores"], np.float64)
      keys = np.broadcast_to(a["key_valid"], scores.shape)
      e = np.where(keys, np.exp(scores - np.where(keys, scores, -np.inf).max(-1, keepdims=True)),
                   0.0)
      rows = np.broadcast_to(a["query_valid"], scores.shape)
      np.testing.assert_allclose(np.where(rows, a["weights"], 0.0),
                                 np.where(rows, e / e.sum(-1, keepdims=True), 0.0),
                                 atol=1e-6, err_msg=kind)
  # and the model itself keeps nothing of it
  assert not nnx.state(model, nnx.Intermediate)
  assert not model.encoder_layers[0].self_attn.sow_attention


def test_diagnostics_take_the_plain_kernel_where_a_fused_one_would_run(monkeypatch):
  # A fused kernel (cuDNN) never forms the weights: where one would run, the
  # diagnostics' pass computes the self attentions in the plain kernel, with
  # the training forward's numbers, while the training forward hands over.
  model = model_of(small(dropout=0.0))
  calls = _record_fused_handovers(monkeypatch)
  want, _ = model(SRC, TGT_IN)
  assert len(calls) == 4  # 2 encoder, 2 decoder self attentions handed over
  (got, _), attention = diagnostics.transformer_attention(model, SRC, TGT_IN)
  assert len(calls) == 4  # none handed over
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert [len(attention[k]) for k in ("encoder_self", "decoder_self", "cross")] == [2, 2, 2]


def test_no_layer_takes_a_diagnostics_switch():
  # The diagnostics read what the attention modules sow; the layers' and the
  # model's calls take only what changes their outputs.
  import inspect
  switches = {"self_aux", "return_attention", "return_max_logits", "return_weights"}
  for call in (transformer.EncoderLayer.__call__, transformer.DecoderLayer.__call__,
               Transformer.__call__, Transformer.encode):
    assert not switches & set(inspect.signature(call).parameters), call.__qualname__
