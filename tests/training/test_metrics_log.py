"""A metrics log or an atomic write that cannot go on says which file, and
says nothing untrue first."""

from __future__ import annotations

import os

import pytest

from attention_jax import files
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


def test_a_bare_nan_of_an_older_writer_reads_as_the_null_written_now(tmp_path):
  # An older writer put a value that was not finite as bare NaN or Infinity
  # (the JSON module's default); it read back as a float NaN, a number to
  # every reader (a diverged member's perplexity became a loss of NaN).
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 250, "seed": 0, "val_bleu": 1.5, "val_ppl": 30.0}\n'
                  '{"step": 500, "seed": 0, "val_bleu": NaN, "val_ppl": NaN}\n'
                  '{"step": 500, "seed": 1, "loss": Infinity, "max_logit_l0": -Infinity}\n'
                  '{"step": 600, "seed": 1, "loss": 1e999}\n'
                  '{"step": 750, "seed": 0, "val_')  # cut by a kill: dropped, as before
  assert metrics_log.MetricsLog(str(path), write=False).read() == [
      {"step": 250, "seed": 0, "val_bleu": 1.5, "val_ppl": 30.0},
      {"step": 500, "seed": 0, "val_bleu": None, "val_ppl": None},
      {"step": 500, "seed": 1, "loss": None, "max_logit_l0": None},
      {"step": 600, "seed": 1, "loss": None}]


@pytest.mark.parametrize("line, needle", [
    ('{"step": 500, "seed": 0, "val_ppl": "abc"}', "`val_ppl` is 'abc', not a number"),
    ('{"step": 500, "seed": 0, "val_ppl": 0}', "`val_ppl` is 0, not a perplexity"),
    ('{"step": 500, "seed": 0, "loss": true}', "`loss` is True, not a number"),
    ('{"step": 500, "seed": 0, "loss": [1.0]}', "`loss` is [1.0], not a number"),
    ('{"step": "500", "seed": 0, "loss": 1.0}', "`step` is '500', not an integer"),
    ('{"step": 500, "seed": 0.5, "loss": 1.0}', "`seed` is 0.5, not an integer"),
    ('{"step": 500, "seed": 0, "diagnostics": {"entropy": "x"}}',
     "`diagnostics.entropy` is 'x', not a number"),
    ('{"step": 500, "seed": 0, "val_', "not JSON"),  # not the last line: no kill cuts it
    (b"\x00\xff\xfe\x9c binary", "not JSON"),
])
def test_a_row_of_another_kind_is_one_line_naming_the_file_and_the_line(tmp_path, line,
                                                                        needle):
  path = tmp_path / "metrics.jsonl"
  good = b'{"step": 250, "seed": 0, "loss": 2.0}\n'
  path.write_bytes(good + (line if isinstance(line, bytes) else line.encode()) + b"\n" + good)
  with pytest.raises(ValueError) as info:
    metrics_log.MetricsLog(str(path), write=False).read()
  message = str(info.value)
  assert message.startswith(f"{path} line 2 is damaged (") and needle in message
  assert "\n" not in message
