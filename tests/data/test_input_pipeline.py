"""`input_pipeline.load`: names, keywords and splits are checked up front."""

import pytest

from attention_jax.data import input_pipeline


def test_unknown_name_lists_the_allowed_ones():
  with pytest.raises(ValueError) as info:
    input_pipeline.load("wmt99")
  for name in input_pipeline.NAMES:
    assert name in str(info.value)


def test_unknown_keyword_is_named():
  with pytest.raises(TypeError, match="min_lenght"):
    input_pipeline.load("copy", min_lenght=3)
  with pytest.raises(TypeError, match="num_train"):
    input_pipeline.load("bible_en_es", num_train=3)


def test_unknown_split_lists_the_allowed_ones():
  data = input_pipeline.load("copy", num_train=20, num_valid=5, num_test=5)
  with pytest.raises(ValueError, match="train, validation, test"):
    data.texts("dev")
  with pytest.raises(ValueError, match="hypotheses"):
    data.bleu("test", ["a"])


@pytest.mark.parametrize("kwargs, flag", [(dict(max_length=0), "max_length"),
                                          (dict(vocab_size=2), "vocab_size")])
def test_bad_sizes(kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    input_pipeline.load("bible_en_es", **kwargs)


def test_eval_pass_ignores_the_training_length_limit():
  data = input_pipeline.load("copy", num_train=50, num_valid=50, num_test=50,
                             min_len=5, max_len=15, max_length=8)
  train = [i for b in data.batches("train", 8) for i in b.index if i >= 0]
  assert train and all(len(data.texts("train")[0][i].split()) + 1 <= 8 for i in train)
  test = sorted(i for b in data.batches("test", 8, shuffle=False) for i in b.index if i >= 0)
  assert test == list(range(50))
