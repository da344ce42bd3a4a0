"""The dataset of an experiment config, loaded once per process."""

from __future__ import annotations

from attention_jax.data import input_pipeline
from attention_jax.data import synthetic
from attention_jax.sweep.config import ExperimentConfig


def load(dataset: str, *, max_length: int, vocab_size: int, data_dir: str = ""):
  """`input_pipeline.load` of `dataset` with an experiment's settings: the
  synthetic tasks (`synthetic.TASKS`) have no tokenizer, so no vocabulary
  size; `data_dir` "" is the default cache folder."""
  kwargs = dict(max_length=max_length)
  if data_dir:
    kwargs["data_dir"] = data_dir
  if not dataset.startswith(synthetic.TASKS):
    kwargs["vocab_size"] = vocab_size
  return input_pipeline.load(dataset, **kwargs)


def load_data(cfg: ExperimentConfig):
  """The dataset `cfg` trains on."""
  return load(cfg.dataset, max_length=cfg.max_length, vocab_size=cfg.vocab_size,
              data_dir=cfg.data_dir)


def data_key(cfg: ExperimentConfig) -> tuple:
  """The fields that name a config's dataset: configs equal here share it."""
  return (cfg.dataset, cfg.data_dir, cfg.vocab_size, cfg.max_length)


class Datasets:
  """The datasets of the configs asked for, each loaded once (`load_data`).

  `limit` caps how many are held (all are dropped to make room): a
  `--workers` process holds one at a time, so that its memory holds one
  dataset whatever grid it trains.
  """

  def __init__(self, limit: int | None = None):
    self.limit = limit
    self._loaded = {}

  def put(self, cfg: ExperimentConfig, data) -> None:
    """Uses `data` (already loaded by the caller) for `cfg`'s dataset."""
    self._loaded[data_key(cfg)] = data

  def get(self, cfg: ExperimentConfig):
    key = data_key(cfg)
    if key not in self._loaded:
      if self.limit is not None and len(self._loaded) >= self.limit:
        self._loaded.clear()
      self._loaded[key] = load_data(cfg)
    return self._loaded[key]
