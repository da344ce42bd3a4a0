"""Synthetic copy / reverse / sort tasks behind the common interface."""


import numpy as np
import pytest

from attention_jax.data import input_pipeline, synthetic


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_targets_follow_the_task(task):
  splits, tok = synthetic.make_task(task, num_train=300, num_valid=50, num_test=50, seed=4)
  order = {s: k for k, s in enumerate(tok.symbols)}
  for split, (sources, targets) in splits.items():
    for s, t in zip(sources, targets):
      words = s.split()
      assert 5 <= len(words) <= 15
      expected = {"copy": words, "reverse": words[::-1],
                  "sort": sorted(words, key=order.__getitem__)}[task]
      assert t.split() == expected
  assert [len(splits[s][0]) for s in ("train", "validation", "test")] == [300, 50, 50]


def test_eval_strings_are_unseen_in_train():
  splits, _ = synthetic.make_task("copy", num_symbols=3, min_len=3, max_len=5,
                                  num_train=200, num_valid=40, num_test=40)
  train = set(splits["train"][0])
  held_out = splits["validation"][0] + splits["test"][0]
  assert not train & set(held_out) and len(set(held_out)) == len(held_out)


def test_seeded():
  a = input_pipeline.load("reverse", seed=3)
  assert a.num_examples("train") == 10_000
  assert a.texts("train") == input_pipeline.load("reverse", seed=3).texts("train")
  assert a.texts("train") != input_pipeline.load("reverse", seed=4).texts("train")


def test_symbols_and_vocab_size():
  assert synthetic.symbols(3) == ("a", "b", "c")
  many = synthetic.symbols(30)
  assert list(many) == sorted(many) and len(set(many)) == 30
  data = input_pipeline.load("sort", vocab_size=40)
  assert data.tokenizer.vocab_size == 40
  with pytest.raises(ValueError, match="num_symbols"):
    input_pipeline.load("sort", vocab_size=40, num_symbols=10)


def test_batches_and_bleu():
  data = input_pipeline.load("copy", num_train=500, num_valid=60, num_test=60)
  assert data.max_length == 16  # max_len 15 + EOS
  tok = data.tokenizer
  hyps = [""] * data.num_examples("test")
  for b in data.batches("test", 16, shuffle=False):
    assert b.src.shape[1] <= 16
    for row, i in enumerate(b.index):
      if i >= 0:
        np.testing.assert_array_equal(b.src[row], b.tgt[row])  # copy task
        hyps[i] = tok.decode(b.tgt[row])
  assert hyps == data.texts("test")[1]
  assert data.bleu("test", hyps) == pytest.approx(100.0)
  assert data.bleu("test", [h[::-1] for h in hyps]) < 50
  # Lengths 6..16 with EOS fall in the 8 and 16 buckets: waste stays < 25%.
  assert input_pipeline.load("copy").padding_fraction("train", 64) < 0.25


@pytest.mark.parametrize("kwargs, flag", [
    (dict(num_valid=0), "num_valid"), (dict(min_len=9, max_len=3), "min_len"),
    (dict(num_symbols=1), "num_symbols"),
    (dict(num_symbols=2, min_len=1, max_len=2, num_train=10, num_valid=50), "num_symbols"),
])
def test_bad_arguments_are_named(kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    synthetic.make_task("copy", **kwargs)
