"""SentencePiece and word tokenizers: special ids, round trips, caching, errors."""

import numpy as np
import pytest

from attention_jax.data import tokenizer as tok_lib

_WORDS = ("el principio crió Dios los cielos y la tierra in the beginning God created "
          "heaven and earth señor jehová niño año über café naïve").split()


def _corpus(n=1500, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(_WORDS, size=rng.integers(3, 12))) + rng.choice([".", ",", "?"])
          for _ in range(n)]


@pytest.fixture(scope="module")
def sp():
  return tok_lib.SentencePieceTokenizer(tok_lib.train_sentencepiece(_corpus(), 400))


def test_special_ids_are_fixed(sp):
  assert (sp.pad_id, sp.eos_id, sp.sos_id, sp.unk_id) == (0, 1, 2, 3)
  assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "</s>", "<s>", "<unk>"]
  assert sp.vocab_size == 400


def test_round_trip_including_unseen_characters(sp):
  texts = _corpus(200, seed=1) + ["Ünïcödé 中文 — “quotes” 123"]
  for text in texts:
    ids = sp.encode(text)
    assert ids and min(ids) >= 4, "encode must not emit special ids"
    assert sp.decode(ids) == text


def test_decode_stops_at_eos_and_skips_pad_and_sos(sp):
  ids = sp.encode("la tierra")
  row = np.array([2] + ids + [1] + sp.encode("y los cielos") + [0, 0], np.int32)
  assert sp.decode(row) == "la tierra"
  assert sp.decode([0, 2] + ids) == "la tierra"


def test_batch_encode_matches_single(sp):
  texts = _corpus(20, seed=2)
  assert sp.encode_batch(texts) == [sp.encode(t) for t in texts]


def test_vocab_too_large_names_the_flag():
  with pytest.raises(ValueError, match=r"`vocab_size` \(--vocab_size\) = 100000.*at most"):
    tok_lib.train_sentencepiece(_corpus(200), 100_000)


def test_vocab_too_small_names_the_flag():
  with pytest.raises(ValueError, match="vocab_size"):
    tok_lib.train_sentencepiece(_corpus(200), 50)


def test_load_or_train_caches_and_replaces_torn_files(tmp_path):
  path = tmp_path / "sub" / "bpe400.model"
  calls = []

  def texts():
    calls.append(1)
    return _corpus()

  first = tok_lib.load_or_train(path, texts, 400)
  second = tok_lib.load_or_train(path, texts, 400)
  assert len(calls) == 1
  assert second.encode("el año") == first.encode("el año")
  assert not list(path.parent.glob("*.tmp"))
  path.write_bytes(path.read_bytes()[:100])  # a torn file
  third = tok_lib.load_or_train(path, texts, 400)
  assert len(calls) == 2 and third.vocab_size == 400


def test_word_tokenizer():
  tok = tok_lib.WordTokenizer(["a", "b", "c"])
  assert tok.vocab_size == 7
  assert tok.encode("c a b") == [6, 4, 5]
  assert tok.encode("a zz") == [4, tok.unk_id]
  assert tok.decode([2, 6, 4, 1, 5, 0]) == "c a"
  assert tok.decode(np.array([4, 5, 0, 0])) == "a b"
  with pytest.raises(ValueError, match="symbols"):
    tok_lib.WordTokenizer(["a", "a"])
  with pytest.raises(ValueError, match="symbols"):
    tok_lib.WordTokenizer(["a b"])
