"""WMT English->German through TensorFlow Datasets (for users with a network).

Three datasets, all read as en -> de:

  wmt15_britz  `wmt_translate` with a custom `WmtConfig`, the setup of Britz et
               al. (2017), "Massive Exploration of Neural Machine Translation
               Architectures": train = europarl_v7 + commoncrawl +
               newscommentary_v10 (de-en), validation = newstest2013,
               test = newstest2014 and test2015 = newstest2015.
  wmt14        stock `wmt14_translate/de-en` (validation = newsdev2014 +
               newstest2013, test = newstest2014).
  wmt_t2t      stock `wmt_t2t_translate/de-en` (the Tensor2Tensor set).

TFDS's WMT builders need TensorFlow (and the `importlib_resources` backport)
to *prepare* the data; both come with the `wmt` extra
(`pip install -e '.[wmt]'`). Once prepared in `array_record` format the data is
read without TensorFlow. Tests exercise this module offline with
`tfds.testing.mock_data`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import tensorflow_datasets as tfds

from attention_jax.data import tfds_prep

__all__ = ["NAMES", "SPLITS", "SOURCE", "TARGET", "britz_config", "make_builder",
           "require_tensorflow", "prepare", "read_split"]

NAMES = ("wmt15_britz", "wmt14", "wmt_t2t")
SPLITS = {
    "wmt15_britz": ("train", "validation", "test", "test2015"),
    "wmt14": ("train", "validation", "test"),
    "wmt_t2t": ("train", "validation", "test"),
}
SOURCE, TARGET = "en", "de"
_STOCK = {"wmt14": "wmt14_translate/de-en", "wmt_t2t": "wmt_t2t_translate/de-en"}


def britz_config():
  """`WmtConfig` of Britz et al. (2017). TFDS's sub-datasets are all xx->en, so
  the pair is declared ('de', 'en'); the direction en->de is chosen at read time."""
  from tensorflow_datasets.translate import wmt  # pylint: disable=g-import-not-at-top
  return wmt.WmtConfig(
      name="britz2017",
      version=tfds.core.Version("1.0.0"),
      description=("Britz et al. (2017): europarl_v7 + commoncrawl + newscommentary_v10 "
                   "train, newstest2013 validation, newstest2014/2015 test."),
      language_pair=("de", "en"),
      subsets={
          tfds.Split.TRAIN: ["europarl_v7", "commoncrawl", "newscommentary_v10"],
          tfds.Split.VALIDATION: ["newstest2013"],
          tfds.Split.TEST: ["newstest2014"],
          "test2015": ["newstest2015"],
      },
  )


def make_builder(name: str, data_dir: str | os.PathLike) -> tfds.core.DatasetBuilder:
  if name not in NAMES:
    raise ValueError(f"unknown WMT dataset {name!r}; allowed: {', '.join(NAMES)}.")
  data_dir = os.fspath(data_dir)
  if name == "wmt15_britz":
    return tfds.builder("wmt_translate", config=britz_config(), data_dir=data_dir,
                        file_format="array_record")
  # TFDS registers a legacy builder when its module is imported, which a plain
  # `import tensorflow_datasets` does not always do: import it explicitly.
  importlib.import_module(f"tensorflow_datasets.translate.{_STOCK[name].split('_translate')[0]}")
  return tfds.builder(_STOCK[name], data_dir=data_dir, file_format="array_record")


def require_tensorflow() -> None:
  """Raises ImportError, naming the extra to install, if TF is missing."""
  missing = [m for m in ("tensorflow", "importlib_resources")
             if importlib.util.find_spec(m) is None]
  if missing:
    raise ImportError(
        f"Preparing the WMT datasets with TensorFlow Datasets needs "
        f"{' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
        f"installed. Install the `wmt` extra: `pip install -e '.[wmt]'` (then run "
        f"the preparation again; reading prepared data needs no TensorFlow). "
        f"Without network access use the offline Bible corpus (`bible_en_es`).")


def prepare(name: str, data_dir: str | os.PathLike) -> tfds.core.DatasetBuilder:
  """Downloads and prepares `name` once (array_record); returns its builder."""
  tfds.disable_progress_bar()
  return tfds_prep.ensure_prepared(lambda: make_builder(name, data_dir), lock_dir=data_dir,
                               marker=False, before_prepare=lambda: require_tensorflow())


def read_split(builder: tfds.core.DatasetBuilder, split: str, *, source: str = SOURCE,
               target: str = TARGET) -> tuple[list[str], list[str]]:
  """(sources, targets) of one split, raw text, in stored order."""
  cols = tfds_prep.read_source(builder.as_data_source(split=split), (source, target))
  return cols[source], cols[target]
