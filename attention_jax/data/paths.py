"""Where attention_jax keeps what it downloads and prepares.

The cache root is `$ATTENTION_JAX_CACHE`, else `$XDG_CACHE_HOME/attention_jax`,
else `~/.cache/attention_jax`; SWORD modules unpacked without root go under
`<root>/sword`, prepared TFDS data and tokenizers under `<root>/data`.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root", "default_data_dir"]


def cache_root() -> Path:
  """`$ATTENTION_JAX_CACHE`, else `$XDG_CACHE_HOME/attention_jax`, else `~/.cache/attention_jax`."""
  if os.environ.get("ATTENTION_JAX_CACHE"):
    return Path(os.environ["ATTENTION_JAX_CACHE"])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "attention_jax"


def default_data_dir() -> Path:
  """`<cache root>/data`: prepared datasets and tokenizers."""
  return cache_root() / "data"
