"""The Bible corpus: filters, stable splits, TFDS preparation, tokenizer, batches."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from attention_jax.data import bible, input_pipeline, sword, tfds_prep
from attention_jax.data import tokenizer as tokenizer_lib

ROOT = Path(__file__).resolve().parents[2]


def _pair(ref, en, es):
  return sword.VersePair(ref, en, es)


# --- filters and splits (no modules needed) -------------------------------------

def test_filter_pairs():
  w = lambda n: " ".join(["w"] * n)
  pairs = [_pair("a", w(10), w(10)), _pair("b", "", w(3)), _pair("c", w(150), w(150)),
           _pair("d", w(151), w(100)), _pair("e", w(30), w(10)), _pair("f", w(31), w(10)),
           _pair("g", w(4), w(13))]
  assert [p.ref for p in bible.filter_pairs(pairs)] == ["a", "c", "e"]


def test_split_of_is_stable_across_processes():
  refs = [f"Book {c}:{v}" for c in range(1, 30) for v in range(1, 30)]
  here = [bible.split_of(r) for r in refs]
  code = ("import sys, json; from attention_jax.data import bible; "
          "print(json.dumps([bible.split_of(r) for r in json.load(sys.stdin)]))")
  # Another process with another str-hash seed agrees.
  out = subprocess.run([sys.executable, "-c", code], input=json.dumps(refs), text=True,
                       capture_output=True, cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONHASHSEED": "12345"})
  assert json.loads(out.stdout) == here


def test_split_proportions():
  refs = [f"Ref {i}" for i in range(100_000)]
  counts = {s: 0 for s in ("train", "validation", "test")}
  for r in refs:
    counts[bible.split_of(r)] += 1
  assert counts["validation"] / 1e5 == pytest.approx(0.0322, abs=0.002)
  assert counts["test"] / 1e5 == pytest.approx(0.0644, abs=0.002)


def test_split_pairs_removes_dev_test_text_seen_in_train():
  refs = [f"Ref {i}" for i in range(3000)]
  by_split = {s: [r for r in refs if bible.split_of(r) == s] for s in ("train", "validation", "test")}
  pairs = [_pair(r, f"en {r}", f"es {r}") for r in refs]
  t = by_split["train"][0]
  v1, v2 = by_split["validation"][:2]
  x1 = by_split["test"][0]
  pairs += [_pair(v1 + "x", f"en {t}", "fresh es"),   # English seen in train
            _pair(v2 + "x", "fresh en", f"es {t}"),   # Spanish seen in train
            _pair(x1 + "x", "new en", "new es")]
  # Give the extra pairs a split by reusing split_of on their own refs.
  splits = bible.split_pairs(pairs)
  held_out = splits["validation"] + splits["test"]
  train_en = {p.en for p in splits["train"]}
  train_es = {p.es for p in splits["train"]}
  assert not any(p.en in train_en or p.es in train_es for p in held_out)
  assert sum(map(len, splits.values())) >= len(pairs) - 2


# --- the real corpus ---------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("bible_data")


@pytest.fixture(scope="module")
def en_es(data_dir, sword_root):
  return input_pipeline.load("bible_en_es", data_dir=data_dir, sword_path=sword_root)


def test_split_counts(en_es):
  counts = {s: en_es.num_examples(s) for s in en_es.splits}
  for split, (lo, hi) in bible.SPLIT_RANGES.items():
    assert lo <= counts[split] <= hi
  # The documented figures (README): splits never move between runs or machines.
  assert counts == bible.EXPECTED_COUNTS
  # 31,084 pairs - 10 with a length ratio > 3 - dev/test pairs seen in train.
  assert 31_000 <= sum(counts.values()) <= 31_074


def test_splits_are_disjoint_and_free_of_train_text(en_es):
  refs = {s: set(en_es.keys(s)) for s in en_es.splits}
  assert not refs["train"] & refs["validation"]
  assert not refs["train"] & refs["test"]
  assert not refs["validation"] & refs["test"]
  train_en, train_es = map(set, en_es.texts("train"))
  for split in ("validation", "test"):
    en, es = en_es.texts(split)
    assert not train_en & set(en) and not train_es & set(es)
  for split in en_es.splits:  # every ref lands where its hash says
    assert all(bible.split_of(r) == split for r in refs[split])


def test_tfds_data_source(en_es, data_dir):
  source = tfds.data_source("bible_translate/en-es", split="train", data_dir=str(data_dir),
                            download=False)
  assert len(source) == en_es.num_examples("train")
  first = source[0]
  assert set(first) == {"en", "es", "ref"}
  assert first["ref"] in (b"Genesis 1:1", "Genesis 1:1")  # canonical order on disk
  builder = tfds.builder("bible_translate/es-en", data_dir=str(data_dir))
  assert builder.info.supervised_keys == ("es", "en")


def test_reverse_direction_shares_examples_and_tokenizer(en_es, data_dir, sword_root):
  es_en = input_pipeline.load("bible_es_en", data_dir=data_dir, sword_path=sword_root)
  for split in ("validation", "test"):
    assert es_en.texts(split) == tuple(reversed(en_es.texts(split)))
  assert (es_en.source_lang, es_en.target_lang) == ("es", "en")
  assert len(list(Path(data_dir).rglob("*.model"))) == 1
  sample = en_es.texts("test")[0][:50]
  assert es_en.tokenizer.encode_batch(sample) == en_es.tokenizer.encode_batch(sample)


def test_tokenizer_on_the_corpus(en_es):
  tok = en_es.tokenizer
  assert tok.vocab_size == 8_000
  assert (tok.pad_id, tok.eos_id, tok.sos_id) == (0, 1, 2)
  rng = np.random.default_rng(0)
  train_en, train_es = en_es.texts("train")
  picks = rng.choice(len(train_en), 2_000, replace=False)
  sample = ([train_en[i] for i in picks] + [train_es[i] for i in picks]
            + en_es.texts("validation")[0] + en_es.texts("validation")[1])
  ids = tok.encode_batch(sample)
  assert all(tok.decode(x) == s for x, s in zip(ids, sample))
  assert all(min(x) >= 4 for x in ids)
  mean = np.mean([len(x) for x in ids])
  assert 20 < mean < 45  # ~24 words per verse, a little over one piece per word


def test_tokenizer_is_cached_and_reused(en_es, data_dir, sword_root):
  (model,) = Path(data_dir).rglob("*bpe8000.model")
  before = model.stat().st_mtime_ns
  again = input_pipeline.load("bible_en_es", data_dir=data_dir, sword_path=sword_root)
  assert model.stat().st_mtime_ns == before
  assert again.tokenizer.encode("Jesus wept.") == en_es.tokenizer.encode("Jesus wept.")
  builder = bible.prepare("en-es", data_dir=data_dir, sword_path=sword_root)
  assert tfds_prep.recorded_digest(builder, model.name) == again.tokenizer.sha256


def test_vocab_size_too_large_names_the_flag(en_es, data_dir, sword_root):
  with pytest.raises(ValueError, match=r"vocab_size.*200000"):
    input_pipeline.load("bible_en_es", data_dir=data_dir, sword_path=sword_root,
                        vocab_size=200_000)


def test_batches(en_es):
  assert en_es.padding_fraction("train", 64) < 0.25
  grid = set(input_pipeline.batching.bucket_boundaries(en_es.max_length))
  seen = []
  for b in en_es.batches("test", 64, shuffle=False):
    assert b.src.shape[0] == 64 and b.src.shape == b.tgt.shape and b.src.shape[1] in grid
    seen.extend(int(i) for i in b.index if i >= 0)
  assert sorted(seen) == list(range(en_es.num_examples("test")))
  a = [b.index for _, b in zip(range(5), en_es.batches("train", 32, seed=7, repeat=True))]
  c = [b.index for _, b in zip(range(5), en_es.batches("train", 32, seed=7, repeat=True))]
  assert all(np.array_equal(x, y) for x, y in zip(a, c))
  src_texts, tgt_texts = en_es.texts("test")
  b = next(en_es.batches("test", 4, shuffle=False))
  assert en_es.tokenizer.decode(b.src[0]) == src_texts[b.index[0]]
  assert en_es.tokenizer.decode(b.tgt[0]) == tgt_texts[b.index[0]]


def test_prepare_data_cli_reuses_prepared_data(en_es, data_dir, sword_root):
  (marker,) = Path(data_dir).glob(f"bible_translate/en-es/*/{tfds_prep.MARKER}")
  before = marker.stat().st_mtime_ns
  out = subprocess.run(
      [sys.executable, "-m", "experiments.prepare_data", f"--data_dir={data_dir}",
       f"--sword_path={sword_root}", "--datasets=bible_en_es"],
      cwd=ROOT, capture_output=True, text=True, check=True)
  counts = {s: en_es.num_examples(s) for s in en_es.splits}
  assert f"bible_en_es: {counts}" in out.stdout
  assert marker.stat().st_mtime_ns == before  # nothing was rebuilt


def test_prepare_data_cli_names_the_install_command(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "experiments.prepare_data", f"--data_dir={tmp_path}",
       f"--sword_path={tmp_path / 'nowhere'}", "--datasets=bible_en_es"],
      cwd=ROOT, capture_output=True, text=True)
  assert out.returncode != 0
  assert "sudo apt-get install sword-text-kjv sword-text-sparv" in out.stderr
  assert str(tmp_path / "nowhere") in out.stderr


# --- half-written preparations are rebuilt, never read ---------------------------

class ToyPairs(tfds.core.GeneratorBasedBuilder):
  """A 30-example dataset to exercise `ensure_prepared` in milliseconds."""
  VERSION = tfds.core.Version("1.0.0")
  code_path = None

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"en": tfds.features.Text(), "es": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(20), "test": self._generate_examples(10)}

  def _generate_examples(self, n):
    for i in range(n):
      yield str(i), {"en": f"en {i}", "es": f"es {i}"}


def _killed_before_marker(version_dir):
  # Killed between writing the data and the completion marker, next to the
  # temp folder of an earlier killed run, with a torn shard.
  (version_dir / tfds_prep.MARKER).unlink()
  (version_dir.parent / "incomplete.ABCDEF_1.0.0").mkdir()
  shard = next(version_dir.glob("*-train.array_record*"))
  shard.write_bytes(shard.read_bytes()[:10])


def _lost_metadata(version_dir):
  (version_dir / "dataset_info.json").unlink()


def _lost_shard(version_dir):
  next(version_dir.glob("*-test.array_record*")).unlink()


def _truncated_shard(version_dir):  # the marker stays: only its checksums can tell
  shard = next(version_dir.glob("*-train.array_record*"))
  shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _flipped_bytes(version_dir):  # same size, other content
  shard = next(version_dir.glob("*-train.array_record*"))
  data = bytearray(shard.read_bytes())
  data[len(data) // 2: len(data) // 2 + 64] = bytes(b ^ 0xFF for b in
                                                     data[len(data) // 2: len(data) // 2 + 64])
  shard.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_killed_before_marker, _lost_metadata, _lost_shard,
                                    _truncated_shard, _flipped_bytes])
def test_ensure_prepared_rebuilds_damaged_data(tmp_path, damage):
  make = lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record")
  prepare = lambda: tfds_prep.ensure_prepared(make, lock_dir=tmp_path)
  builder = prepare()
  version_dir = Path(os.fspath(builder.data_path))
  marker_time = (version_dir / tfds_prep.MARKER).stat().st_mtime_ns
  assert prepare().data_path == builder.data_path  # reused as is
  assert (version_dir / tfds_prep.MARKER).stat().st_mtime_ns == marker_time
  damage(version_dir)
  rebuilt = prepare()
  assert (version_dir / tfds_prep.MARKER).is_file()
  assert not list(version_dir.parent.glob("incomplete.*"))
  cols = tfds_prep.read_source(rebuilt.as_data_source(split="train"), ("en", "es"))
  assert sorted(cols["en"]) == sorted(f"en {i}" for i in range(20))


@pytest.mark.parametrize("damage,file,wrong", [
    (_killed_before_marker, tfds_prep.MARKER, "is missing (a preparation cut short)"),
    (_lost_metadata, "dataset_info.json", "is missing"),
    (_lost_shard, "-test.array_record", "is missing"),
    (_truncated_shard, "-train.array_record", "bytes where "),
    (_flipped_bytes, "-train.array_record", "(SHA-256 differs)")])
def test_a_damaged_corpus_is_named_with_what_is_wrong_before_it_is_rebuilt(
    tmp_path, capsys, damage, file, wrong):
  # It was rebuilt without a word: a user never learnt the corpus was damaged.
  make = lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record")
  builder = tfds_prep.ensure_prepared(make, lock_dir=tmp_path)
  first = capsys.readouterr().out
  assert " is damaged: " not in first  # a first preparation is no repair
  version_dir = Path(os.fspath(builder.data_path))
  damage(version_dir)
  tfds_prep.ensure_prepared(make, lock_dir=tmp_path)
  lines = capsys.readouterr().out.splitlines()
  said = [i for i, line in enumerate(lines) if " is damaged: " in line]
  assert len(said) == 1, lines
  line = lines[said[0]]
  assert line.startswith(f"the prepared data in {version_dir} is damaged: {version_dir}/")
  assert line.endswith("; rebuilding it")
  named = line.split(" is damaged: ")[1]
  assert file in named.split(" ")[0] and wrong in named, line
  assert [i for i, l in enumerate(lines) if l.startswith("preparing ")] == [said[0] + 1], lines


def test_concurrent_preparations_take_turns(tmp_path):
  make = lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record")
  results, errors = [], []

  def worker():
    try:
      results.append(tfds_prep.ensure_prepared(make, lock_dir=tmp_path))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=worker) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and len(results) == 3
  cols = tfds_prep.read_source(results[0].as_data_source(split="test"), ("en",))
  assert sorted(cols["en"]) == sorted(f"en {i}" for i in range(10))


def test_a_builder_made_before_another_prepared_the_data_is_not_returned(tmp_path):
  # The race behind a flaky run of the test above: a thread makes its builder
  # (no info on disk yet), another finishes the preparation, then the folder
  # checks pass for the first builder although its info lists no split.
  make = lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record")
  stale = make()
  tfds_prep.ensure_prepared(make, lock_dir=tmp_path)
  assert not stale.info.splits
  made = iter([stale])
  builder = tfds_prep.ensure_prepared(lambda: next(made, None) or make(), lock_dir=tmp_path)
  assert builder is not stale
  cols = tfds_prep.read_source(builder.as_data_source(split="test"), ("en",))
  assert sorted(cols["en"]) == sorted(f"en {i}" for i in range(10))


# --- the tokenizer model is checked against its recorded SHA-256 -----------------

_SAMPLE = "el principio crió Dios los cielos y la tierra, in the beginning God created"


def _silent_damage(model: bytes) -> bytes:
  """`model` with the first single-bit flip (from the middle on) that
  SentencePiece still loads and that changes the tokens of `_SAMPLE`."""
  from attention_jax.data import tokenizer
  want = tokenizer.SentencePieceTokenizer(model).encode(_SAMPLE)
  for byte in range(len(model) // 2, len(model)):
    for bit in range(8):
      damaged = bytearray(model)
      damaged[byte] ^= 1 << bit
      try:
        if tokenizer.SentencePieceTokenizer(bytes(damaged)).encode(_SAMPLE) != want:
          return bytes(damaged)
      except (RuntimeError, ValueError):
        pass
  raise AssertionError("no flip found that still loads")


def test_a_tokenizer_model_damaged_after_training_is_named_and_retrained(tmp_path):
  from tests.data.test_tokenizer import _corpus
  builder = tfds_prep.ensure_prepared(
      lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record"), lock_dir=tmp_path)
  path = tmp_path / "toy_pairs" / "tokenizers" / "1.0.0-bpe400.model"
  trained, lines = [], []

  def load():
    return input_pipeline.load_tokenizer(
        builder, path, lambda: trained.append(1) or _corpus(), 400, lock_dir=tmp_path,
        log=lines.append)

  first = load()
  assert tfds_prep.recorded_digest(builder, path.name) == first.sha256
  assert load().encode(_SAMPLE) == first.encode(_SAMPLE) and len(trained) == 1
  path.write_bytes(_silent_damage(path.read_bytes()))  # SentencePiece loads it

  again = load()
  assert len(trained) == 2 and again.encode(_SAMPLE) == first.encode(_SAMPLE)
  assert len(lines) == 1 and str(path) in lines[0] and "SHA-256" in lines[0]
  assert tfds_prep.recorded_digest(builder, path.name) == again.sha256
  # The data's own checks still pass: the record is in the completion marker.
  assert tfds_prep.ensure_prepared(lambda: ToyPairs(data_dir=str(tmp_path),
                                                    file_format="array_record"),
                                   lock_dir=tmp_path).data_path == builder.data_path
  assert not list(Path(os.fspath(builder.data_path)).glob(f"{tfds_prep.MARKER}.*"))


def test_a_tokenizer_of_a_preparation_without_a_recorded_digest_is_recorded_once(tmp_path):
  # Prepared before digests were recorded: the model is taken as it loads,
  # its digest recorded, and checked from then on.
  from tests.data.test_tokenizer import _corpus
  builder = tfds_prep.ensure_prepared(
      lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record"), lock_dir=tmp_path)
  path = tmp_path / "toy_pairs" / "tokenizers" / "1.0.0-bpe400.model"
  path.parent.mkdir(parents=True)
  path.write_bytes(tokenizer_lib.train_sentencepiece(_corpus(), 400))
  assert tfds_prep.recorded_digest(builder, path.name) is None
  lines = []
  tok = input_pipeline.load_tokenizer(builder, path, lambda: pytest.fail("retrained"), 400,
                                      lock_dir=tmp_path, log=lines.append)
  assert lines == [] and tfds_prep.recorded_digest(builder, path.name) == tok.sha256


def test_half_written_bible_is_rebuilt(tmp_path, en_es, data_dir, sword_root):
  # A copy of the module's preparation (preparing one here took ~5 s more),
  # taken as it is, then damaged.
  shutil.copytree(data_dir / "bible_translate" / "en-es", tmp_path / "bible_translate" / "en-es")
  (marker,) = tmp_path.glob(f"bible_translate/en-es/*/{tfds_prep.MARKER}")
  copied = marker.stat().st_mtime_ns
  builder = bible.prepare("en-es", data_dir=tmp_path, sword_path=sword_root)
  assert marker.stat().st_mtime_ns == copied  # taken as it is, not rebuilt
  _killed_before_marker(Path(os.fspath(builder.data_path)))
  rebuilt = bible.prepare("en-es", data_dir=tmp_path, sword_path=sword_root)
  counts = {s: len(tfds_prep.read_split(rebuilt, s, ("ref",))["ref"]) for s in bible.SPLIT_RANGES}
  assert counts == bible.EXPECTED_COUNTS


@pytest.mark.slow
def test_killed_preparation_is_rebuilt(tmp_path, sword_root):
  cmd = [sys.executable, "-m", "experiments.prepare_data", f"--data_dir={tmp_path}",
         f"--sword_path={sword_root}", "--datasets=bible_en_es"]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 60
  while not list(tmp_path.glob("bible_translate/en-es/incomplete.*")):
    assert proc.poll() is None and time.time() < deadline
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)  # mid-write: no chance to clean up
  proc.wait()
  data = input_pipeline.load("bible_en_es", data_dir=tmp_path, sword_path=sword_root)
  assert {s: data.num_examples(s) for s in data.splits} == bible.EXPECTED_COUNTS


def test_preparing_our_own_data_says_so_and_not_that_it_downloads(tmp_path, capsys):
  """TFDS announced "Downloading and preparing dataset Unknown size" though
  nothing is downloaded; our own builders say what they do."""
  make = lambda: ToyPairs(data_dir=str(tmp_path), file_format="array_record")
  tfds_prep.ensure_prepared(make, lock_dir=tmp_path)
  out = capsys.readouterr().out
  assert "Downloading and preparing" not in out and "downloaded and prepared" not in out, out
  assert "from local files into" in out and "nothing is downloaded" in out
  tfds_prep.ensure_prepared(make, lock_dir=tmp_path)  # prepared already: says nothing
  assert capsys.readouterr().out == ""
