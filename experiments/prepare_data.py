"""Prepares the offline Bible corpus (both directions) and its SentencePiece model.

    python -m experiments.prepare_data                  # what `make data` runs
    python -m experiments.prepare_data --stats          # + tokens/sentence, padding
    python -m experiments.prepare_data --data_dir=/tmp/d --sword_path=/usr/share/sword

Idempotent: a complete prepared dataset and tokenizer are reused (about a
second); a half-written one (killed run) is detected and rebuilt. Data goes to
`--data_dir`, by default `<cache root>/data` (`$ATTENTION_JAX_CACHE`, else
`$XDG_CACHE_HOME/attention_jax`, else `~/.cache/attention_jax`), never into
the repository. The SWORD modules are looked up in `--sword_path`,
`/usr/share/sword`, then `<cache root>/sword/usr/share/sword` (`make sword`).
"""

import statistics
import sys
import time

from absl import app, flags, logging

from attention_jax.data import input_pipeline, sword
from experiments import common

_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Prepared data + tokenizers; default <cache root>/data.")
_SWORD_PATH = flags.DEFINE_string(
    "sword_path", None, "SWORD root holding mods.d/ and modules/ (optional).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8_000, "SentencePiece BPE vocabulary size.")
_DATASETS = flags.DEFINE_list(
    "datasets", ["bible_en_es", "bible_es_en"], "Datasets to prepare (input_pipeline.NAMES).")
_STATS = flags.DEFINE_bool(
    "stats", False, "Also report tokens per sentence and the batch padding fraction.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Batch size for the padding figure.")


def _describe(data, batch_size: int) -> None:
  tok = data.tokenizer
  for split in data.splits:
    sources, targets = data.texts(split)
    src_ids, tgt_ids = data.token_ids(split)
    print(f"  {split:<10} {len(sources):>6} pairs  tokens/sentence "
          f"{data.source_lang}: mean {src_ids.lengths.mean():.1f} median "
          f"{statistics.median(src_ids.lengths.tolist()):.0f}  "
          f"{data.target_lang}: mean {tgt_ids.lengths.mean():.1f} median "
          f"{statistics.median(tgt_ids.lengths.tolist()):.0f}  "
          f"words/sentence {data.source_lang}: "
          f"{statistics.mean(len(s.split()) for s in sources):.1f} "
          f"{data.target_lang}: {statistics.mean(len(t.split()) for t in targets):.1f}")
  print(f"  padding fraction (train, batch {batch_size}, max_length {data.max_length}): "
        f"{data.padding_fraction('train', batch_size):.3f}; vocab {tok.vocab_size}")


def _check_flags() -> None:
  """Every flag checked before any work: one line naming the flag, nothing written."""
  if not _DATASETS.value:
    sys.exit("prepare_data: `--datasets` is empty; name at least one of "
             f"{', '.join(input_pipeline.NAMES)}.")
  unknown = [n for n in _DATASETS.value if n not in input_pipeline.NAMES]
  if unknown:
    sys.exit(f"prepare_data: `--datasets` got {', '.join(map(repr, unknown))}; allowed: "
             f"{', '.join(input_pipeline.NAMES)}.")
  if _BATCH_SIZE.value < 1:
    sys.exit(f"prepare_data: `--batch_size` must be > 0, got {_BATCH_SIZE.value}.")
  if _VOCAB_SIZE.value < 5:
    sys.exit(f"prepare_data: `--vocab_size` must be >= 5, got {_VOCAB_SIZE.value}.")
  if _DATA_DIR.value:
    try:
      common.check_output_dir("data_dir", _DATA_DIR.value)
    except ValueError as e:
      sys.exit(f"prepare_data: {e}")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"prepare_data: unexpected arguments {argv[1:]}")
  _check_flags()
  logging.set_verbosity(logging.ERROR)  # TFDS info/warnings are noise here.
  for name in _DATASETS.value:
    start = time.perf_counter()
    kwargs = {"sword_path": _SWORD_PATH.value} if name.startswith("bible") else {}
    try:
      data = input_pipeline.load(name, data_dir=_DATA_DIR.value,
                                 vocab_size=_VOCAB_SIZE.value, **kwargs)
    except (sword.SwordModuleError, ValueError, ImportError) as e:
      sys.exit(f"prepare_data: {name}: {e}")  # The message names the fix.
    except OSError as e:  # e.g. a full disk or a read-only cache folder
      sys.exit(f"prepare_data: {name}: {e.strerror or e} ({e.filename or 'while writing'})")
    counts = {split: data.num_examples(split) for split in data.splits}
    elapsed = time.perf_counter() - start
    where = _DATA_DIR.value or input_pipeline.default_data_dir()
    print(f"{name}: {counts} (vocab {data.tokenizer.vocab_size}, {where}) "
          f"ready in {elapsed:.1f} s")
    if _STATS.value:
      _describe(data, _BATCH_SIZE.value)


if __name__ == "__main__":
  app.run(main)
