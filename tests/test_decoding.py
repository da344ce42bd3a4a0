"""Tests for attention_jax.decoding (greedy and beam search)."""

import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import decoding
from attention_jax.models import (Seq2Seq, Seq2SeqConfig, Transformer, TransformerConfig,
                                  create_ensemble)

V = 23
SRC = np.array([[5, 6, 7, 8, 9, 1], [9, 10, 1, 0, 0, 0], [4, 4, 1, 0, 0, 0]], np.int32)


def rnn():
  model = Seq2Seq(Seq2SeqConfig(V, embed_dim=8, hidden_dim=8, attention_dim=6),
                  rngs=nnx.Rngs(0))
  # Make <eos> likely enough that some hypotheses end with it.
  model.output.bias[...] = model.output.bias[...].at[1].add(1.5)
  return model


def transformer():
  return Transformer(TransformerConfig(V, num_layers=2, d_model=16, num_heads=4, d_ff=32,
                                       max_length=32, share_embeddings=False),
                     rngs=nnx.Rngs(1))


MODELS = {"rnn": rnn, "transformer": transformer}


# -- a history-dependent toy model with hand-made probabilities ---------------


class Bigram:
  """Implements the decoding protocol: next-token log-probs = table[previous token]."""

  def __init__(self, probs, max_decode_length=None):
    probs = np.asarray(probs, np.float64)
    with np.errstate(divide="ignore"):  # probability 0 -> log-prob -inf
      self.table = jnp.asarray(np.log(probs / probs.sum(-1, keepdims=True)), jnp.float32)
    self.config = types.SimpleNamespace(pad_id=0, eos_id=1, sos_id=2,
                                        vocab_size=probs.shape[0], has_attention=True)
    self.max_decode_length = max_decode_length
    self.traces = 0

  def init_decode(self, src, max_len):
    return {"valid": src != 0}, {"steps": jnp.zeros(src.shape[:1], jnp.int32)}

  def decode_step(self, memory, carry, tokens, t):
    self.traces += 1  # Python side effect: counts traces, not executions
    valid = memory["valid"].astype(jnp.float32)
    weights = valid / jnp.sum(valid, -1, keepdims=True)  # uniform over real tokens
    return self.table[tokens], {"steps": carry["steps"] + 1}, weights


def bigram(transitions, vocab=8, floor=1e-6, **kw):
  """`transitions[prev] = {token: prob}`; everything else gets `floor`."""
  probs = np.full((vocab, vocab), floor)
  for prev, row in transitions.items():
    for token, p in row.items():
      probs[prev, token] = p
  return Bigram(probs, **kw)


def test_greedy_stops_at_eos_which_is_not_written():
  model = bigram({2: {3: 0.9}, 3: {4: 0.9}, 4: {1: 0.9}})  # sos -> 3 -> 4 -> eos
  out, attn = decoding.greedy(model, SRC[:2], return_attention=True)
  assert out.shape == (2, math.ceil(1.5 * 6 + 10)) and out.dtype == jnp.int32
  np.testing.assert_array_equal(out[:, :3], [[3, 4, 0], [3, 4, 0]])
  assert np.all(np.asarray(out)[:, 2:] == 0)
  np.testing.assert_allclose(attn[0, :2].sum(-1), 1.0)
  np.testing.assert_allclose(attn[1, 0], [1 / 3] * 3 + [0] * 3, rtol=1e-6)
  assert np.all(np.asarray(attn)[:, 2:] == 0)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_length_limit_is_relative_to_the_real_source_length(search):
  model = bigram({2: {3: 0.9, 1: 0.0}, 3: {4: 0.9, 1: 0.0}, 4: {3: 0.9, 1: 0.0}})  # no <eos>
  run = (decoding.greedy if search == "greedy"
         else functools.partial(decoding.beam_search, beam_size=2))
  out = np.asarray(run(model, SRC, max_len_a=1.5, max_len_b=1))  # L = ceil(1.5 * 6 + 1)
  assert out.shape == (3, 10)
  # Real lengths (the source's <eos> counts) 6, 3, 3: floor(1.5 * len + 1) tokens.
  np.testing.assert_array_equal((out != 0).sum(1), [10, 5, 5])
  np.testing.assert_array_equal(out[1, :5], [3, 4, 3, 4, 3])
  capped = np.asarray(run(model, SRC, max_len=4, max_len_a=1.5, max_len_b=1))
  assert capped.shape == (3, 4) and np.all(capped != 0)
  model.max_decode_length = 3  # e.g. a Transformer's positional table
  assert run(model, SRC, max_len_a=1.5, max_len_b=1).shape == (3, 3)


def test_beam_search_escapes_the_garden_path_that_greedy_takes():
  # Greedy takes 3 (p .55), then <eos> (p .25, ties broken towards the lower id);
  # beam search finds 4 <eos> (.45 * .99 > .55 * .25).
  model = bigram({2: {3: 0.55, 4: 0.45}, 3: {1: 0.25, 5: 0.25, 6: 0.25, 7: 0.25},
                  4: {1: 0.99}})
  src = SRC[:1]
  np.testing.assert_array_equal(decoding.greedy(model, src)[0, :2], [3, 0])
  np.testing.assert_array_equal(decoding.beam_search(model, src, beam_size=1)[0, :2], [3, 0])
  for alpha in (0.0, 0.6, 2.0):
    out = decoding.beam_search(model, src, beam_size=2, length_penalty=alpha)
    np.testing.assert_array_equal(out[0, :2], [4, 0])


def test_length_penalty_prefers_longer_hypotheses():
  # [3, eos]: p = .5 * .85 = .425; [4, 5, eos]: p = .5 * .9 * .9 = .405.
  model = bigram({2: {3: 0.5, 4: 0.5}, 3: {1: 0.85, 6: 0.15}, 4: {5: 0.9, 6: 0.1},
                  5: {1: 0.9, 6: 0.1}, 6: {7: 1.0}, 7: {6: 1.0}})
  short = decoding.beam_search(model, SRC[:1], beam_size=2, length_penalty=0.0)
  long = decoding.beam_search(model, SRC[:1], beam_size=2, length_penalty=2.0)
  # Raw: log .425 = -0.856 > log .405 = -0.904. GNMT alpha = 2: lp(2) = 1.361,
  # lp(3) = 1.778, so -0.629 < -0.508: the longer one wins.
  np.testing.assert_array_equal(short[0, :3], [3, 0, 0])
  np.testing.assert_array_equal(long[0, :3], [4, 5, 0])


def test_each_search_traces_its_step_once_per_shape():
  """One `lax.while_loop`: the model's step is traced once per compilation."""
  model = bigram({2: {3: 0.9}, 3: {1: 0.9}})
  for search in (decoding.greedy, functools.partial(decoding.beam_search, beam_size=3)):
    run = jax.jit(lambda src: search(model, src))
    model.traces = 0
    first = run(SRC)
    run(SRC[::-1].copy())  # new values, same shape: no new trace
    assert model.traces == 1
    run(SRC[:2])  # new shape: one more
    assert model.traces == 2
    np.testing.assert_array_equal(first[:, :2], [[3, 0]] * 3)


# -- real models ---------------------------------------------------------------


def make_scorer(model, length):
  """Teacher-forced logits `[L, V]` for one source row and one padded target."""
  graphdef, state = nnx.split(model)
  return jax.jit(lambda src_row, tgt_in: nnx.merge(graphdef, state)(
      src_row[None], tgt_in[None])[0][0])


def reference_beam_search(model, scorer, src_row, beam_size, alpha, max_len_a, max_len_b):
  """Pure-Python beam search with the same rules, scoring each prefix with a
  full teacher-forced forward pass (no cache, no carried state)."""
  cfg = model.config
  src_len = int(np.sum(src_row != cfg.pad_id))
  length = math.ceil(max_len_a * src_row.shape[0] + max_len_b)
  limit = min(int(math.floor(max_len_a * src_len + max_len_b)), length)

  def next_logp(prefix):  # <pad> and <sos> are banned: renormalise over the rest
    tgt_in = np.zeros(length, np.int32)
    tgt_in[0] = cfg.sos_id
    tgt_in[1:len(prefix) + 1] = prefix
    logits = np.asarray(scorer(src_row, tgt_in)[len(prefix)], np.float64)
    logits[[cfg.pad_id, cfg.sos_id]] = -np.inf
    return logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()

  penalty = lambda n: ((5.0 + n) / 6.0) ** alpha
  alive, finished = [([], 0.0)], []
  for t in range(limit):
    candidates = []
    for beam, (seq, score) in enumerate(alive):
      logp = next_logp(seq)
      candidates += [(score + logp[v], beam, v, seq) for v in range(cfg.vocab_size)]
    candidates = [c for c in candidates if np.isfinite(c[0])]
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    top = candidates[:2 * beam_size]
    finished += [(s / penalty(t + 1), seq) for rank, (s, _, v, seq) in enumerate(top)
                 if v == cfg.eos_id and rank < beam_size]
    alive = [(seq + [v], s) for s, _, v, seq in top if v != cfg.eos_id][:beam_size]
    if t + 1 >= limit:
      finished += [(s / penalty(t + 1), seq) for seq, s in alive]
    finished = sorted(finished, key=lambda f: -f[0])[:beam_size]
    if len(finished) >= beam_size:
      break
  best = finished[0][1]
  return np.array(best + [0] * (length - len(best)), np.int32)


def beam(model, src, beam_size, length_penalty=0.6):
  """`jit_beam_search` returning the attention, the length penalty always passed
  (jit's cache tells a passed value from a default): the tests of one model
  share their compiled searches, which nnx.jit caches by the model's structure."""
  return decoding.jit_beam_search(model, src, beam_size=beam_size,
                                  length_penalty=length_penalty, return_attention=True)


# The searches below take the default length limits and return the attention, so
# that they are the ones of the next tests: K=1 with beam width one, K=3 with the
# padding and ensemble tests.
@pytest.mark.parametrize("name", list(MODELS))
def test_beam_search_matches_a_python_reference(name):
  model = MODELS[name]()
  scorer = make_scorer(model, math.ceil(1.5 * SRC.shape[1] + 10))
  lengths = []
  # The length penalty is applied by the search, not the model: alpha 0 is
  # checked with the RNN (each setting compiles a Transformer search anew).
  settings = ((1, 0.6), (3, 0.6), (3, 0.0)) if name == "rnn" else ((1, 0.6), (3, 0.6))
  for beam_size, alpha in settings:
    out, _ = beam(model, SRC, beam_size, alpha)
    for b in range(SRC.shape[0]):
      want = reference_beam_search(model, scorer, SRC[b], beam_size, alpha, 1.5, 10)
      np.testing.assert_array_equal(out[b], want, err_msg=f"K={beam_size} alpha={alpha} b={b}")
    lengths.append((np.asarray(out) != 0).sum(1))
  if name == "rnn":  # the biased <eos> ends some hypotheses early
    limits = np.floor(1.5 * (SRC != 0).sum(1) + 10)
    assert np.any(np.concatenate(lengths) < np.tile(limits, len(settings)))


@pytest.mark.parametrize("name", list(MODELS))
def test_beam_width_one_equals_greedy(name):
  model = MODELS[name]()
  tokens, attn = decoding.jit_greedy(model, SRC, return_attention=True)
  beam_tokens, beam_attn = beam(model, SRC, beam_size=1)
  np.testing.assert_array_equal(beam_tokens, tokens)
  np.testing.assert_allclose(beam_attn, attn, rtol=1e-6, atol=1e-7)
  assert attn.shape == (3, tokens.shape[1], SRC.shape[1])
  written = np.asarray(tokens) != 0
  np.testing.assert_allclose(np.asarray(attn).sum(-1)[written], 1.0, rtol=1e-5)
  assert np.all(np.asarray(attn)[~written] == 0.0)
  assert np.all(np.asarray(attn)[1, :, 3:] == 0.0)  # padding gets no attention


@pytest.mark.parametrize("name", list(MODELS))
def test_padding_the_source_leaves_the_decoded_output_unchanged(name):
  model = MODELS[name]()
  padded = np.pad(SRC, ((0, 0), (0, 3)))
  for run in (functools.partial(decoding.jit_greedy, return_attention=True),
              functools.partial(beam, beam_size=3)):
    (out, attn), (out_p, attn_p) = (
        jax.tree.map(np.asarray, run(model, src)) for src in (SRC, padded))
    width = out.shape[1]
    np.testing.assert_array_equal(out_p[:, :width], out)
    assert np.all(out_p[:, width:] == 0)
    np.testing.assert_allclose(attn_p[:, :width, :SRC.shape[1]], attn, rtol=1e-5, atol=1e-6)
    assert np.all(attn_p[:, :, SRC.shape[1]:] == 0)  # the added padding gets no attention


def test_decoding_inside_jit_and_vmap_over_an_ensemble():
  # The configuration and beam size of `rnn()`'s tests: the searches of the
  # separately built models below are the ones they compiled.
  config = Seq2SeqConfig(V, embed_dim=8, hidden_dim=8, attention_dim=6)
  seeds = [0, 5]
  graphdef, states = create_ensemble(Seq2Seq, config, seeds)

  @jax.jit
  @functools.partial(jax.vmap, in_axes=(0, None))
  def decode(state, src):
    model = nnx.merge(graphdef, state)
    greedy = decoding.greedy(model, src, return_attention=True)
    beam = decoding.beam_search(model, src, beam_size=3, return_attention=True)
    return greedy, beam

  (g_tok, g_att), (b_tok, b_att) = decode(states, SRC)
  assert g_tok.shape == b_tok.shape == (2, 3, 19)
  for i, seed in enumerate(seeds):
    model = Seq2Seq(config, rngs=nnx.Rngs(seed))
    tok, att = decoding.jit_greedy(model, SRC, return_attention=True)
    np.testing.assert_array_equal(g_tok[i], tok)
    np.testing.assert_allclose(g_att[i], att, rtol=1e-5, atol=1e-6)
    tok, att = beam(model, SRC, beam_size=3)
    np.testing.assert_array_equal(b_tok[i], tok)
    np.testing.assert_allclose(b_att[i], att, rtol=1e-5, atol=1e-6)
  assert np.any(np.asarray(g_tok[0]) != np.asarray(g_tok[1]))


def test_bad_arguments_raise_named_errors():
  model = bigram({2: {1: 0.9}})
  with pytest.raises(ValueError, match="`beam_size` must be a positive int"):
    decoding.beam_search(model, SRC, beam_size=0)
  with pytest.raises(ValueError, match="`length_penalty`"):
    decoding.beam_search(model, SRC, length_penalty=-1.0)
  with pytest.raises(ValueError, match="`max_len_a` and `max_len_b`"):
    decoding.greedy(model, SRC, max_len_a=-1.0)
  with pytest.raises(ValueError, match="`max_len`"):
    decoding.greedy(model, SRC, max_len=0)
  with pytest.raises(TypeError, match="`src` must be an integer array"):
    decoding.greedy(model, SRC.astype(np.float32))
  no_attention = Seq2Seq(Seq2SeqConfig(V, embed_dim=8, hidden_dim=8, decoder="none_init"),
                         rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="return_attention=True needs a model with attention"):
    decoding.greedy(no_attention, SRC, return_attention=True)
  assert decoding.jit_greedy(no_attention, SRC).shape == (3, 19)


@pytest.mark.parametrize("shape,k", [((5, 8000), 8), ((3, 7), 2), ((4, 1001), 6), ((2, 3, 97), 4)])
def test_two_stage_top_k_equals_lax_top_k(shape, k):
  from attention_jax.decoding import _top_k
  x = jax.random.normal(jax.random.PRNGKey(1), shape)
  ties = jnp.round(x)  # many equal values: the lower index must win, as in top_k
  for y in (x, ties):
    want, got = jax.lax.top_k(y, k), jax.jit(_top_k, static_argnums=1)(y, k)
    np.testing.assert_array_equal(np.asarray(want[0]), np.asarray(got[0]))
    np.testing.assert_array_equal(np.asarray(want[1]), np.asarray(got[1]))


class _GenericProtocol:
  """A model seen through the decoding protocol's required part only: beam
  search then repeats every memory and carry leaf per beam and gathers the
  carry's rows from the parents (the path every model took before)."""

  def __init__(self, model):
    self.model, self.config = model, model.config
    self.max_decode_length = model.max_decode_length

  def init_decode(self, src, max_len):
    return self.model.init_decode(src, max_len)

  def decode_step(self, memory, carry, tokens, t):
    return self.model.decode_step(memory, carry, tokens, t)


@pytest.mark.parametrize("score", ["scaled_dot", "additive", "qk_norm", "location"])
def test_transformer_beams_share_one_copy_of_the_memory_with_the_same_result(score):
  # One layer per stack: each score's form of the shared memory, at half the
  # compile time. The sharing across two layers is in the reference test above,
  # whose Transformer searches with the shared memory (two layers, scaled_dot).
  model = Transformer(TransformerConfig(V, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                                        score=score, attention_dim=12, max_length=32),
                      rngs=nnx.Rngs(3))
  mine, mine_attn = decoding.beam_search(model, SRC, beam_size=3, return_attention=True)
  want, want_attn = decoding.beam_search(_GenericProtocol(model), SRC, beam_size=3,
                                         return_attention=True)
  np.testing.assert_array_equal(mine, want)
  np.testing.assert_allclose(mine_attn, want_attn, atol=1e-6)
  memory, carry = model.init_decode(jnp.asarray(SRC), 8)
  beam_memory, beam_carry = model.init_beams(memory, carry, 3)
  assert beam_memory["kv"][0][0].shape[0] == SRC.shape[0]  # one copy per sentence
  assert beam_carry["cache"][0].keys.shape[0] == 3 * SRC.shape[0]  # a cache per beam


def test_one_copy_of_the_memory_saves_what_the_beam_copies_would_hold():
  # d_k = 256, beam 4: the generic path holds 4 copies of every layer's
  # cross-attention keys; XLA's memory analysis of the compiled search shows
  # at least 3 of them saved.
  config = TransformerConfig(V, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                             score="dot", attention_dim=256, max_length=64)
  model = Transformer(config, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  src = jax.ShapeDtypeStruct((8, 40), jnp.int32)

  def temp_bytes(wrap):
    search = lambda state, src: decoding.beam_search(wrap(nnx.merge(graphdef, state)), src,
                                                     beam_size=4)
    analysis = jax.jit(search).lower(state, src).compile().memory_analysis()
    return analysis.temp_size_in_bytes

  copies = 3 * 2 * 8 * 2 * 40 * (256 + 8) * 4  # (K-1) x layers x B x H x S x (d_k + d_v) x 4 B
  assert temp_bytes(lambda m: m) <= temp_bytes(_GenericProtocol) - copies
