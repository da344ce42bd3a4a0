"""WMT through TFDS, offline: builder configs and the pipeline on mock data.

`tfds.testing.mock_data` replaces preparation and reading with generated
examples and needs no TensorFlow, so these tests run in the default suite.
"""

import importlib.util

import pytest
import tensorflow_datasets as tfds

from attention_jax.data import input_pipeline, wmt


def test_britz_config():
  cfg = wmt.britz_config()
  assert cfg.language_pair == ("de", "en")
  assert cfg.subsets[tfds.Split.TRAIN] == ["europarl_v7", "commoncrawl", "newscommentary_v10"]
  assert cfg.subsets[tfds.Split.VALIDATION] == ["newstest2013"]
  assert cfg.subsets[tfds.Split.TEST] == ["newstest2014"]
  assert cfg.subsets["test2015"] == ["newstest2015"]
  builder = wmt.make_builder("wmt15_britz", "/nonexistent")
  # Every subset exists for de-en: none is silently skipped by TFDS.
  assert builder.subsets == cfg.subsets
  assert builder.info.supervised_keys == ("de", "en")


@pytest.mark.parametrize("name, full_name", [("wmt14", "wmt14_translate/de-en"),
                                             ("wmt_t2t", "wmt_t2t_translate/de-en")])
def test_stock_builders(name, full_name):
  builder = wmt.make_builder(name, "/nonexistent")
  assert f"{builder.name}/{builder.builder_config.name}" == full_name
  assert set(builder.subsets) == {"train", "validation", "test"}


def test_missing_tensorflow_is_a_clear_error(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda n, *a: None if n == "tensorflow" else real(n, *a))
  with pytest.raises(ImportError, match=r"tensorflow.*pip install -e '\.\[wmt\]'"):
    wmt.require_tensorflow()


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="TensorFlow is installed here")
def test_preparing_without_tensorflow_fails_before_any_download(tmp_path):
  with pytest.raises(ImportError, match=r"\[wmt\]"):
    input_pipeline.load("wmt14", data_dir=tmp_path)
  assert not list(tmp_path.rglob("*.array_record*"))


@pytest.mark.parametrize("name", wmt.NAMES)
def test_pipeline_on_mock_data(name, tmp_path, monkeypatch):
  # mock_data makes download_and_prepare a no-op; the TensorFlow check that
  # guards the real preparation is not what is tested here.
  monkeypatch.setattr(wmt, "require_tensorflow", lambda: None)
  with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    data = input_pipeline.load(name, data_dir=tmp_path, vocab_size=300, max_length=64)
    assert data.splits == wmt.SPLITS[name]
    assert (data.source_lang, data.target_lang) == ("en", "de")
    for split in data.splits:
      sources, targets = data.texts(split)
      assert len(sources) == len(targets) == data.num_examples(split) == 40
      assert all(isinstance(s, str) and s for s in sources + targets)
    tok = data.tokenizer
    assert tok.vocab_size == 300 and tok.pad_id == 0
    src, _ = data.texts("test")
    assert tok.decode(tok.encode(src[0])) == src[0]
    seen = sorted(i for b in data.batches("test", 16, shuffle=False) for i in b.index if i >= 0)
    assert seen == list(range(40))
    b = next(data.batches("train", 16, seed=1, repeat=True))
    assert b.src.shape[0] == 16 and b.src.shape == b.tgt.shape
  # The joint tokenizer is cached next to the prepared data, under data_dir.
  assert len(list(tmp_path.rglob("*-bpe300.model"))) == 1
