"""Presets as files: each names its command, its time and what it should give."""

import importlib
import pkgutil

import pytest

from attention_jax.sweep import config, presets


def test_every_preset_file_is_a_preset_and_builds_a_valid_config():
  files = {m.name for m in pkgutil.iter_modules(presets.__path__)}
  assert files == set(config.PRESETS)
  for name in files:
    cfg = config.from_preset(name)
    assert cfg.replace(**config.PRESETS[name]) == cfg


@pytest.mark.parametrize("name", list(config.PRESETS))
def test_each_preset_file_documents_command_time_and_expected_result(name):
  doc = importlib.import_module(f"attention_jax.sweep.presets.{name}").__doc__
  assert f"--preset={name}" in doc
  assert "Time:" in doc and "Expected" in doc
  assert "issue" not in doc.lower()  # reasons, not issue numbers
