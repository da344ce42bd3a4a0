"""Presets as files: each names its command, its time and what it should give.

The library's presets are `attention_jax/sweep/presets/*.py`; a study's are
`experiments/<study>/presets/*.py`, which the drivers' package adds.
"""

import importlib
import pathlib
import pkgutil
import types

import pytest

import experiments
from attention_jax.sweep import config, presets

experiments.add_study_presets()

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _files() -> dict[str, str]:
  """Preset name -> module, from the files on disk."""
  found = {m.name: f"attention_jax.sweep.presets.{m.name}"
           for m in pkgutil.iter_modules(presets.__path__)}
  for folder in sorted((ROOT / "experiments").glob("*/presets")):
    study = folder.parent.name
    found.update({m.name: f"experiments.{study}.presets.{m.name}"
                  for m in pkgutil.iter_modules([str(folder)])})
  return found


def test_every_preset_file_is_a_preset_and_builds_a_valid_config():
  files = _files()
  assert set(files) == set(config.PRESETS)
  assert files == config.PRESET_MODULES
  assert {"transformer_lr_cpu", "transformer_lr_premise_cpu"} <= set(files)  # a study's too
  for name in files:
    cfg = config.from_preset(name)
    assert cfg.replace(**config.PRESETS[name]) == cfg


@pytest.mark.parametrize("name", list(config.PRESETS))
def test_each_preset_file_documents_command_time_and_expected_result(name):
  doc = importlib.import_module(config.PRESET_MODULES[name]).__doc__
  assert f"--preset={name}" in doc
  assert "Time:" in doc and "Expected" in doc
  assert "issue" not in doc.lower()  # reasons, not issue numbers


def test_a_preset_name_taken_by_another_module_is_refused():
  clash = types.ModuleType("experiments.elsewhere.presets.quick")
  clash.OVERRIDES = {}
  with pytest.raises(ValueError, match="'quick' is defined twice"):
    config.add_presets([clash])
  assert config.PRESET_MODULES["quick"] == "attention_jax.sweep.presets.quick"
