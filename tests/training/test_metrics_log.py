"""A metrics log or an atomic write that cannot go on says which file, and
says nothing untrue first."""

from __future__ import annotations

import os

import pytest

from attention_jax.training import files
from attention_jax.training import metrics_log


def test_a_log_replaced_by_a_folder_is_an_error_naming_it_and_no_false_warning(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  lines = []
  log = metrics_log.MetricsLog(path, log=lines.append)
  log.truncate_after(0)
  log.append({"step": 1, "seed": 0, "loss": 1.0})
  os.remove(path)
  os.mkdir(path)  # what a probe did mid-run
  with pytest.raises(IsADirectoryError) as e:
    log.append({"step": 2, "seed": 0, "loss": 0.5})
  assert e.value.filename == path and "not a file any more" in str(e.value)
  assert not lines  # no "rewrote its lines" claim


def test_an_atomic_write_that_fails_names_the_file_asked_for_not_its_temporary(tmp_path):
  target = tmp_path / "result.json"
  target.mkdir()  # os.replace of a file onto a folder fails
  with pytest.raises(OSError) as e:
    files.atomic_write(str(target), "{}")
  assert e.value.filename == str(target) and e.value.filename2 is None
  assert os.listdir(tmp_path) == ["result.json"]  # and no temporary is left


def test_an_atomic_write_into_a_missing_place_names_the_file(tmp_path):
  (tmp_path / "a").write_text("")  # a file where a folder should be
  with pytest.raises(OSError) as e:
    files.atomic_write(str(tmp_path / "a" / "b.json"), "{}")
  assert e.value.filename == str(tmp_path / "a")  # the file in the way
