"""Tests for attention_jax.models.seq2seq."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.layers import SCORES
from attention_jax.models import Seq2Seq, Seq2SeqConfig, count_params, create_ensemble
from tests.models import synthetic_task
from tests.models.synthetic_task import encode, forward

V = 19
SRC = np.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]], np.int32)  # [2, 5]
TGT_IN = np.array([[2, 11, 12, 13], [2, 15, 0, 0]], np.int32)  # [2, 4]


def small(**overrides):
  kw = dict(vocab_size=V, embed_dim=8, hidden_dim=6, attention_dim=5, decoder_layers=2,
            dropout=0.2, max_source_length=12)
  kw.update(overrides)
  return Seq2SeqConfig(**kw)


CONFIGS = {
    "luong_gru_additive": small(),
    "luong_lstm_attentional_2layers": small(cell="lstm", input_feeding="attentional",
                                            encoder_layers=2, score="multiplicative"),
    "luong_no_feeding_location": small(input_feeding="none", score="location"),
    "bahdanau_gru_scaled_mult": small(decoder="bahdanau", score="scaled_multiplicative"),
    "bahdanau_lstm_dot_unidirectional": small(decoder="bahdanau", cell="lstm",
                                              bidirectional=False, score="dot"),
    "none_init_lstm": small(decoder="none_init", cell="lstm"),
    "none_concat_gru": small(decoder="none_concat", encoder_layers=2),
}



def model_of(config, seed=0):
  return Seq2Seq(config, rngs=nnx.Rngs(seed))


# -- configuration -------------------------------------------------------------


@pytest.mark.parametrize("overrides, fragment", [
    (dict(cell="rnn"), "`cell` must be one of ('gru', 'lstm')"),
    (dict(decoder="luong2"), "`decoder` must be one of"),
    (dict(score="concat"), "`score` must be one of"),
    (dict(input_feeding="both"), "`input_feeding` must be one of"),
    (dict(score="dot"), "hidden_dim (6) == encoder output size (12"),
    (dict(score="location", max_source_length=None), "needs `max_source_length`"),
    (dict(dropout=-0.1), "`dropout` must be a float in [0, 1)"),
    (dict(hidden_dim=0), "`hidden_dim` must be a positive int"),
    (dict(pad_id=1), "must differ"),
    (dict(param_dtype="int8"), "`param_dtype` must be one of"),
])
def test_config_rejects_bad_fields(overrides, fragment):
  with pytest.raises(ValueError) as info:
    small(**overrides)
  assert fragment in str(info.value)


def test_britz_base_config():
  c = Seq2SeqConfig.britz_base(8000)
  assert (c.embed_dim, c.hidden_dim, c.encoder_layers, c.bidirectional, c.decoder_layers,
          c.cell, c.decoder, c.score, c.attention_dim, c.input_feeding, c.dropout) == (
              512, 512, 1, True, 2, "gru", "luong", "additive", 512, "context", 0.2)
  assert (c.pad_id, c.eos_id, c.sos_id) == (0, 1, 2)
  assert not c.use_bridge  # Britz: zero initial decoder state with attention
  assert Seq2SeqConfig.britz_base(8000, score="multiplicative").score == "multiplicative"
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.hidden_dim = 3


def expected_params(c: Seq2SeqConfig) -> int:
  """Closed-form parameter count of `Seq2Seq` (Flax GRU / LSTM cell layouts)."""
  h, e, a, v, de = c.hidden_dim, c.embed_dim, c.attention_dim, c.vocab_size, c.encoder_dim

  def cell(n_in):
    if c.cell == "gru":  # input Linear(n_in, 3h) with bias, recurrent Linear(h, 3h) without
      return n_in * 3 * h + 3 * h + h * 3 * h
    return 4 * n_in * h + 4 * (h * h + h)  # 4 input Linears without bias, 4 recurrent with

  dirs = 2 if c.bidirectional else 1
  parts = 2 if c.cell == "lstm" else 1
  total = 2 * v * e  # source and target embeddings
  total += sum(dirs * cell(e if i == 0 else de) for i in range(c.encoder_layers))
  total += cell(e + c.feed_dim) + (c.decoder_layers - 1) * cell(h)
  if c.use_bridge:
    total += (c.encoder_layers * dirs * parts * h) * (c.decoder_layers * parts * h)
    total += c.decoder_layers * parts * h
  if c.has_attention:
    if c.score == "location":
      total += h * c.max_source_length + c.max_source_length
    else:
      total += {"additive": (h * a + a) + (de * a + a) + a,
                "multiplicative": (h * a + a) + (de * a + a),
                "scaled_multiplicative": (h * a + a) + (de * a + a),
                "general": h * de, "cosine": 1, "dot": 0, "scaled_dot": 0}[c.score]
  if c.decoder == "luong":
    total += (h + de) * h + h  # attention_mix
  return total + h * v + v  # output layer


@pytest.mark.parametrize("config", [Seq2SeqConfig.britz_base(8000), *CONFIGS.values(),
                                    small(score="general"), small(score="cosine", bidirectional=False)],
                         ids=["britz_base", *CONFIGS, "general", "cosine"])
def test_parameter_count_matches_closed_form(config):
  model = nnx.eval_shape(lambda: Seq2Seq(config, rngs=nnx.Rngs(0)))
  assert count_params(model) == expected_params(config)
  if config.hidden_dim == 512:  # Britz-base with an 8k vocabulary, additive dim 512
    assert expected_params(config) == 21_741_376


# -- forward pass --------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_shapes_and_attention(name):
  c = CONFIGS[name]
  logits, aux = forward(model_of(c), SRC, TGT_IN)
  assert logits.shape == (2, 4, V) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(logits)))
  if not c.has_attention:
    assert aux == {"scores": None, "weights": None, "key_valid": None}
    return
  assert aux["scores"].shape == aux["weights"].shape == (2, 4, 5)
  np.testing.assert_array_equal(aux["key_valid"], (SRC != 0)[:, None, :])
  weights = np.asarray(aux["weights"])
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert np.all(weights[1, :, 3:] == 0.0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decoder_is_causal(name):
  model = model_of(CONFIGS[name])
  logits, _ = forward(model, SRC, TGT_IN)
  for t in range(3):
    changed = TGT_IN.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 4) % V
    new, _ = forward(model, SRC, changed)
    np.testing.assert_allclose(new[:, :t + 1], logits[:, :t + 1], rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(new[:, t + 1:] - logits[:, t + 1:]))) > 1e-5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_step_decoding_reproduces_teacher_forced_logits(name):
  model = model_of(CONFIGS[name])
  logits, aux = forward(model, SRC, TGT_IN)
  memory, carry = model.init_decode(SRC)
  step = jax.jit(lambda m, c, tok: model.decode_step(m, c, tok, 0))
  for t in range(TGT_IN.shape[1]):
    step_logits, carry, weights = step(memory, carry, jnp.asarray(TGT_IN[:, t]))
    np.testing.assert_allclose(step_logits, logits[:, t], rtol=1e-5, atol=1e-5)
    if aux["weights"] is not None:
      np.testing.assert_allclose(weights, aux["weights"][:, t], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["luong_lstm_attentional_2layers", "none_concat_gru",
                                  "bahdanau_lstm_dot_unidirectional"])
def test_padding_the_source_changes_nothing(name):
  model = model_of(CONFIGS[name])
  padded = np.pad(SRC, ((0, 0), (0, 4)))
  enc, enc_p = encode(model, SRC), encode(model, padded)
  valid = SRC != 0
  np.testing.assert_allclose(np.asarray(enc_p["states"])[:, :5][valid],
                             np.asarray(enc["states"])[valid], rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(enc_p["final"]), jax.tree.leaves(enc["final"])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  logits, aux = forward(model, SRC, TGT_IN)
  logits_p, aux_p = forward(model, padded, TGT_IN)
  np.testing.assert_allclose(logits_p, logits, rtol=1e-5, atol=1e-5)
  if aux["weights"] is not None:
    np.testing.assert_allclose(aux_p["weights"][..., :5], aux["weights"], rtol=1e-5, atol=1e-6)


def test_backward_encoder_starts_at_the_last_real_token():
  """Row 1 of SRC padded equals the same sentence encoded alone, unpadded."""
  model = model_of(CONFIGS["luong_gru_additive"])
  alone = encode(model, SRC[1:, :3])["states"]  # [1, 3, 2h]
  in_batch = encode(model, SRC)["states"][1:, :3]
  np.testing.assert_allclose(in_batch, alone, rtol=1e-5, atol=1e-6)


def test_context_input_feeding_is_zero_at_the_first_step():
  """Britz: the raw context is fed to the next step, a zero vector at t = 0."""
  model = model_of(small(dropout=0.0))
  logits, _ = forward(model, SRC, TGT_IN)
  kernel = model.decoder_cells[0].dense_i.kernel
  e = model.config.embed_dim
  kernel[...] = kernel[...].at[e:].add(1.0)  # the rows that read the fed context
  changed, _ = forward(model, SRC, TGT_IN)
  np.testing.assert_allclose(changed[:, 0], logits[:, 0], rtol=1e-6, atol=1e-6)
  assert float(jnp.max(jnp.abs(changed[:, 1:] - logits[:, 1:]))) > 1e-3


def test_bfloat16_compute_is_close_to_float32():
  c32 = small(dropout=0.0)
  l32, a32 = forward(model_of(c32), SRC, TGT_IN)
  m16 = model_of(dataclasses.replace(c32, dtype=jnp.bfloat16))
  l16, a16 = forward(m16, SRC, TGT_IN)
  assert l16.dtype == jnp.float32 and a16["weights"].dtype == jnp.float32
  assert m16.output.kernel[...].dtype == jnp.float32
  scale = float(jnp.max(jnp.abs(l32)))
  np.testing.assert_allclose(l16, l32, atol=0.05 * scale)
  np.testing.assert_allclose(a16["weights"], a32["weights"], atol=0.03)
  assert float(jnp.max(jnp.abs(l16 - l32))) > 0


def test_dropout_uses_the_rngs_given_at_call_time():
  model = model_of(small())
  det, _ = forward(model, SRC, TGT_IN)
  with pytest.raises(ValueError, match="rngs"):
    forward(model, SRC, TGT_IN, deterministic=False)
  k0, k1 = jax.random.split(jax.random.key(0))
  a, _ = forward(model, SRC, TGT_IN, deterministic=False, rngs=nnx.Rngs(dropout=k0))
  b, _ = forward(model, SRC, TGT_IN, deterministic=False, rngs=nnx.Rngs(dropout=k0))
  c, _ = forward(model, SRC, TGT_IN, deterministic=False, rngs=nnx.Rngs(dropout=k1))
  d, _ = forward(model, SRC, TGT_IN, deterministic=False, rngs=k1)  # a bare key works too
  e, _ = forward(model, SRC, TGT_IN, deterministic=False, rngs=k1)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(d, e)
  assert float(jnp.max(jnp.abs(a - det))) > 1e-4 and float(jnp.max(jnp.abs(a - c))) > 1e-4


def test_score_offset_gradient_flows_through_the_scan():
  model = model_of(small(dropout=0.0))
  logits, aux = forward(model, SRC, TGT_IN)
  zeros = jnp.zeros(aux["scores"].shape)  # [B, T, S]
  np.testing.assert_allclose(forward(model, SRC, TGT_IN, score_offset=zeros)[0], logits, atol=1e-6)

  graphdef, state = nnx.split(model)

  @jax.jit
  def loss(offset):
    out, _ = nnx.merge(graphdef, state)(SRC, TGT_IN, score_offset=offset)
    return jnp.sum(jax.nn.log_softmax(out)[..., 4])

  grad = np.asarray(jax.grad(loss)(zeros))
  assert grad.shape == (2, 4, 5)
  assert np.all(np.abs(grad[0]).max(-1) > 1e-6)  # every step gets a gradient
  assert np.all(grad[1, :, 3:] == 0.0)  # masked keys get none
  np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-6)  # softmax shift invariance
  u = grad / np.linalg.norm(grad)
  eps = 0.05
  numeric = (loss(eps * u) - loss(-eps * u)) / (2 * eps)
  np.testing.assert_allclose(numeric, np.linalg.norm(grad), rtol=2e-2)
  with pytest.raises(ValueError, match=r"score_offset.*\[B, T, S\]"):
    forward(model, SRC, TGT_IN, score_offset=jnp.zeros((2, 5)))
  with pytest.raises(ValueError, match="needs an attention decoder"):
    model_of(CONFIGS["none_init_lstm"])(SRC, TGT_IN, score_offset=zeros)


def test_ensemble_of_seeds_equals_separately_built_models():
  config = CONFIGS["bahdanau_gru_scaled_mult"]
  seeds = [1, 4, 2]
  graphdef, states = create_ensemble(Seq2Seq, config, seeds)
  run = jax.jit(jax.vmap(lambda st: nnx.merge(graphdef, st)(SRC, TGT_IN)))
  logits, aux = run(states)
  assert logits.shape == (3, 2, 4, V) and aux["weights"].shape == (3, 2, 4, 5)
  for i, seed in enumerate(seeds):
    alone, alone_aux = forward(model_of(config, seed), SRC, TGT_IN)
    np.testing.assert_allclose(logits[i], alone, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(aux["weights"][i], alone_aux["weights"], rtol=1e-5, atol=1e-6)
  assert float(jnp.max(jnp.abs(logits[0] - logits[1]))) > 1e-3
  with pytest.raises(ValueError, match="seeds"):
    create_ensemble(Seq2Seq, config, [])


def test_building_the_same_model_again_reuses_its_compiled_initialiser(monkeypatch):
  from attention_jax import models as models_lib
  config = CONFIGS["bahdanau_gru_scaled_mult"]
  _, first = create_ensemble(Seq2Seq, config, [3])
  before = models_lib._builder.cache_info()
  _, again = create_ensemble(Seq2Seq, config, [3])
  after = models_lib._builder.cache_info()
  assert (after.hits, after.misses) == (before.hits + 1, before.misses)
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)
  # Another platform is another entry: the model code reads it while traced.
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  create_ensemble(Seq2Seq, config, [3])
  assert models_lib._builder.cache_info().misses == after.misses + 1


# -- overfitting a synthetic task ------------------------------------------------

_FAST_SCORES = ("additive",)


def _reverse_task(score):
  """The reverse task: sentences of 5-15 symbols for the scores `make test-all`
  runs; for the default suite's score, 256 pairs of 5-8 symbols, learned in
  about 100 steps instead of 200 (12 s against 21 s on the loaded 2-core Xeon,
  2026-11-27): the same property at half the cost."""
  if score in _FAST_SCORES:
    return synthetic_task.make_task(256, 16, task="reverse", max_len=8)
  return synthetic_task.make_task(512, 16, task="reverse")


@pytest.mark.parametrize("score", [
    pytest.param(s, marks=() if s in _FAST_SCORES else pytest.mark.slow) for s in SCORES])
def test_overfits_reverse_task(score):
  same_dim = score in ("dot", "scaled_dot", "cosine")
  config = Seq2SeqConfig(16, embed_dim=32, hidden_dim=64, attention_dim=32,
                         bidirectional=not same_dim, decoder_layers=1, dropout=0.0,
                         score=score, max_source_length=16)
  accuracy, steps, seconds = synthetic_task.train_to_accuracy(
      model_of(config), _reverse_task(score), max_steps=1500, learning_rate=3e-3)
  assert accuracy >= 0.99, (score, accuracy, steps, seconds)


@pytest.mark.slow  # over 30 s on 2 cores (31-218 s, 2-core Xeon, 2026-11-26): in `make test-all`
@pytest.mark.parametrize("score", ["additive", "multiplicative"])
def test_flattened_projections_give_the_layers_own_loss_and_gradients(score, monkeypatch):
  """The output layer and the attention projections run as 2-D products
  (`layers.dense`, faster on XLA:CPU); the loss and every gradient are the
  ones of calling the `nnx.Linear` layers on the 3-D tensors, to float32
  rounding, with dropout on."""
  from attention_jax import layers  # pylint: disable=g-import-not-at-top
  from attention_jax.models import seq2seq  # pylint: disable=g-import-not-at-top
  from attention_jax.training import steps  # pylint: disable=g-import-not-at-top

  config = small(score=score, embed_dim=16, hidden_dim=12, attention_dim=9)
  rng = np.random.default_rng(0)
  src = rng.integers(3, V, (4, 7)).astype(np.int32)
  tgt = rng.integers(3, V, (4, 6)).astype(np.int32)
  tgt_in = steps.decoder_input(tgt, config.sos_id, config.pad_id)

  def loss_and_grads():
    model = model_of(config)
    def loss(m):
      logits, _ = m(src, tgt_in, deterministic=False, rngs=jax.random.key(3))
      return steps.token_loss(logits, tgt, config.pad_id, label_smoothing=0.1)[0]
    return nnx.value_and_grad(loss)(model)

  flat = loss_and_grads()
  plain = lambda layer, x: layer(x)
  monkeypatch.setattr(layers, "dense", plain)
  monkeypatch.setattr(seq2seq, "dense", plain)
  synthetic_task.assert_same_loss_and_gradients(flat, loss_and_grads(), min_leaves=10)
