"""Flags a driver refuses in one line before any work: before it connects
to the other processes (`--workers` with `--num_processes`), and before it
makes the workdir (a path the checkpoint library cannot write)."""

import os
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SMOKE = ["--preset=smoke", "--arm=additive", "--dim=8", "--steps=2", "--checkpoint_every=2",
          "--eval_every=2"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_workers_with_several_processes_are_refused_before_connecting(tmp_path):
  # No coordinator listens there: connecting would wait minutes, then fail
  # with a C++ stack.
  workdir = tmp_path / "w"
  start = time.time()
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.train", *_SMOKE, "--workers=2",
       f"--coordinator_address=localhost:{_free_port()}", "--num_processes=2",
       "--process_id=1", f"--workdir={workdir}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  err = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 1 and err == [
      "error: `--workers` = 2 with several processes (`--num_processes`): give one or the "
      "other."], proc.stderr[-3000:]
  assert time.time() - start < 60
  assert not workdir.exists()


@pytest.mark.parametrize("where", ["workdir", "current folder"])
def test_a_path_that_is_not_utf8_is_refused_naming_workdir_before_any_work(tmp_path, where):
  # b'\xff' is no UTF-8: the file system takes it, TensorStore (Orbax's
  # checkpoints) does not; it trained, then failed at the first checkpoint.
  base = os.fsencode(tmp_path)
  if where == "workdir":
    cwd, workdir = ROOT, base + b"/runs/\xff"
  else:
    cwd, workdir = base + b"/\xff", b"runs"
    os.mkdir(cwd)
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.train", *_SMOKE, b"--workdir=" + workdir],
      cwd=cwd, capture_output=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=240)
  err = [l for l in proc.stderr.decode(errors="replace").splitlines() if l.strip()]
  assert proc.returncode == 1 and len(err) == 1, err[-40:]
  assert err[0].startswith("error: `--workdir` b'") and "is not UTF-8" in err[0]
  assert "\\xff" in err[0]
  assert os.listdir(tmp_path) == ([] if where == "workdir" else [os.fsdecode(b"\xff")])
  if where != "workdir":
    assert os.listdir(cwd) == []
