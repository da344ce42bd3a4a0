"""Files put in place together (`files.Staging`): a set of files written into
a staging folder and renamed into place only once all are written, so that a
kill leaves the old set or the new one; a kill during the renames is
finished by the next writer into the folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attention_jax import files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ("a.md", "b.json", "c.png")


def _old(folder):
  folder.mkdir(exist_ok=True)
  for name in NAMES:
    (folder / name).write_text(f"old {name}")


def _contents(folder):
  return {name: (folder / name).read_text() for name in sorted(os.listdir(folder))}


def test_staged_files_replace_the_old_set_together_and_leave_no_staging(tmp_path):
  _old(tmp_path / "out")
  (tmp_path / "out" / "other.txt").write_text("not ours")
  with files.Staging(str(tmp_path / "out")) as stage:
    for name in NAMES:
      files.atomic_write(os.path.join(stage.path, name), f"new {name}")
    assert (tmp_path / "out" / "a.md").read_text() == "old a.md"  # nothing in place yet
    stage.commit(NAMES)
  assert _contents(tmp_path / "out") == {**{n: f"new {n}" for n in NAMES},
                                         "other.txt": "not ours"}


def test_a_failure_before_the_commit_keeps_the_old_set_and_names_the_file_in_place(tmp_path):
  _old(tmp_path / "out")
  with pytest.raises(OSError) as info:
    with files.Staging(str(tmp_path / "out")) as stage:
      files.atomic_write(os.path.join(stage.path, "a.md"), "new")
      raise OSError(28, "No space left on device", os.path.join(stage.path, "b.json"))
  # the file asked for, not the staging folder nobody asked for
  assert info.value.filename == str(tmp_path / "out" / "b.json")
  assert _contents(tmp_path / "out") == {n: f"old {n}" for n in NAMES}


def test_a_folder_where_a_file_goes_is_refused_before_any_file_is_moved(tmp_path):
  _old(tmp_path / "out")
  os.remove(tmp_path / "out" / "c.png")
  (tmp_path / "out" / "c.png").mkdir()
  with pytest.raises(IsADirectoryError) as info:
    with files.Staging(str(tmp_path / "out")) as stage:
      for name in NAMES:
        files.atomic_write(os.path.join(stage.path, name), f"new {name}")
      stage.commit(NAMES)
  assert info.value.filename == str(tmp_path / "out" / "c.png")
  assert (tmp_path / "out" / "a.md").read_text() == "old a.md"
  assert sorted(os.listdir(tmp_path / "out")) == sorted(NAMES)


KILLED = """
import os, signal, sys
from attention_jax import files
folder, when = sys.argv[1], sys.argv[2]
real_move = files.Staging._move
def move(self, name):  # killed (SIGKILL: nothing runs after it) after the first rename
  real_move(self, name)
  os.kill(os.getpid(), signal.SIGKILL)
files.Staging._move = move
with files.Staging(folder) as stage:
  for name in ('a.md', 'b.json', 'c.png'):
    files.atomic_write(os.path.join(stage.path, name), 'new ' + name)
    if when == 'writing':
      os.kill(os.getpid(), signal.SIGKILL)
  stage.commit(('a.md', 'b.json', 'c.png'))
"""


@pytest.mark.parametrize("when", ["writing", "renaming"])
def test_a_kill_leaves_the_old_set_or_the_next_writer_puts_the_new_one_in_place(tmp_path,
                                                                                when):
  out = tmp_path / "out"
  _old(out)
  proc = subprocess.run([sys.executable, "-c", KILLED, str(out), when], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == -9, proc.stderr
  leftovers = [n for n in os.listdir(out) if n.startswith(files.STAGING_PREFIX)]
  assert len(leftovers) == 1
  said = []
  with files.Staging(str(out), log=said.append):
    pass  # the next writer, before it writes anything
  if when == "writing":  # killed before the commit: the old set, whole
    assert _contents(out) == {n: f"old {n}" for n in NAMES}
    assert said == [f"removed {out / leftovers[0]}, the files of a write that was killed "
                    "before they were all written; the old ones are kept"]
  else:  # killed after one of three renames: the next writer finishes them
    assert _contents(out) == {n: f"new {n}" for n in NAMES}
    assert said == [f"finished putting in place the 2 of 3 files a killed write had left "
                    f"in {out / leftovers[0]}"]
