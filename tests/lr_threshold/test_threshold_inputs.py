"""The threshold report's inputs and outputs: a log value that is no number
(a bare NaN of an older writer, a perplexity of 0, a string, a binary line),
a workdir holding both layouts of the grid, and the report's files replaced
together (a full disk or a SIGTERM while they are written leaves the old
report whole)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.lr_threshold import threshold as th
from experiments.lr_threshold import records as threshold_records
from experiments.lr_threshold import grids
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir as workdir_lib
from experiments.lr_threshold import report as threshold_report
from tests.lr_threshold import test_threshold as fake

MAIN, LRS = fake.MAIN, fake.LRS
ROOT = fake.ROOT
REPORT = ("lr_threshold.md", "lr_threshold.json", "lr_curves.png", "max_logit_heatmaps.png",
          "lr_star.png")


def _rewrite_log(path, change):
  """metrics.jsonl at `path` with each row replaced by `change(row)` (a
  line of text), as an older or a damaged writer left it."""
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  with open(path, "w") as f:
    f.writelines(change(row) + "\n" for row in rows)


def _bare_nan(row):
  """The row as a writer before strict JSON wrote it: NaN, not null."""
  return json.dumps({k: float("nan") if k == "val_ppl" and v is None else v
                     for k, v in row.items()})


def test_a_bare_nan_perplexity_counts_as_diverged_as_a_null_does(tmp_path):
  # dot at d_k 64, lr 1e-2: seed 0 diverged at step 500, and the run's result
  # is not written yet (its last validation is): known from its log alone.
  cell = ("dot", 64, 1e-2)
  for name in ("null", "nan"):
    fake.write_main(tmp_path / name, skip={cell})
    run = fake.write_run(tmp_path / name, MAIN, LRS, *cell, [2.5, 2.5], finished=False,
                         diverged_at={0: 500})
  _rewrite_log(run.metrics, _bare_nan)
  assert "NaN" in open(run.metrics).read()
  read = {name: grids.read_grid(str(tmp_path / name), MAIN, LRS) for name in ("null", "nan")}
  r0 = next(r for r in read["nan"].records if r.cell == grids.Cell(*cell) and r.seed == 0)
  assert r0.diverged and r0.loss == float("inf")
  analyses = {name: th.analyse(g, replicates=50) for name, g in read.items()}
  assert analyses["nan"].losses[grids.Cell(*cell)] == float("inf")
  assert analyses["nan"].sensitivity[("dot", 64)] == pytest.approx(
      analyses["null"].sensitivity[("dot", 64)])
  # every number of the report, the bootstrap's included, as with null
  assert threshold_records.as_json(analyses["nan"]) == threshold_records.as_json(analyses["null"])


def _validation_line(run, seed, step):
  """The 1-based number of the line of `run`'s log validating `seed` at `step`."""
  with open(run.metrics) as f:
    for number, line in enumerate(f, 1):
      row = json.loads(line)
      if row.get("seed") == seed and row.get("step") == step and "val_ppl" in row:
        return number
  raise AssertionError("no such line")


def _damage(path, number, how):
  """Line `number` of `path` replaced: its val_ppl set to a value, or a
  binary line put before it."""
  with open(path, "rb") as f:
    lines = f.read().split(b"\n")
  row = json.loads(lines[number - 1])
  if how == "binary":
    lines.insert(number - 1, b"\x00\xff\xfe\x9c binary")
  else:
    lines[number - 1] = json.dumps({**row, "val_ppl": how}).encode()
  with open(path, "wb") as f:
    f.write(b"\n".join(lines))


@pytest.mark.parametrize("how, needle", [
    (0, "`val_ppl` is 0, not a perplexity"),
    ("abc", "`val_ppl` is 'abc', not a number"),
    ("binary", "not JSON"),
])
def test_a_log_value_that_is_no_perplexity_is_one_line_naming_the_file_and_line(
    tmp_path, how, needle):
  # Each was a traceback (math.log of a string) or a line naming no file
  # ("math domain error", a UnicodeDecodeError).
  run = fake.write_run(tmp_path / "main", MAIN, LRS, "dot", 16, 1e-3, [2.0, 2.0])
  number = _validation_line(run, 0, MAIN.steps)
  _damage(run.metrics, number, how)
  with pytest.raises(ValueError) as info:
    threshold_report.read(str(tmp_path / "main"), "")
  message = str(info.value)
  assert run.metrics in message and f"line {number}" in message and needle in message
  assert "\n" not in message
  if how == "abc":  # and the driver says so in one line, before writing anything
    p = subprocess.run([sys.executable, "-m", "experiments.lr_threshold.report",
                        f"--main={tmp_path / 'main'}", f"--out={tmp_path / 'out'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and run.metrics in last and needle in last
    assert not (tmp_path / "out").exists()


def test_a_runs_folder_beside_a_sweep_grid_is_no_members_grid(tmp_path):
  path = tmp_path / "main"
  fake.write_run(path, MAIN, LRS, "dot", 16, 1e-3, [2.0, 2.0])
  fake.write_run(path, MAIN, LRS, "dot", 16, 1e-2, [2.5, 2.5])
  (path / "runs").mkdir()  # a scratch folder of the same name, beside the grid
  grid = grids.read_grid(str(path), MAIN, LRS)
  # It read every cell as missing, and the report said nothing.
  assert {r.cell for r in grid.records} == {grids.Cell("dot", 16, 1e-3), grids.Cell("dot", 16, 1e-2)}
  assert len(grid.missing) == 2 * 3 * 6 - 2
  # A run folder of the plan in both layouts is one line naming both.
  members_run = workdir_lib.Workdir(str(path)).run(config_lib.Arm.of("dot", 16))
  os.makedirs(members_run.path)
  with pytest.raises(ValueError) as info:
    grids.read_grid(str(path), MAIN, LRS)
  message = str(info.value)
  assert members_run.path in message and "learning_rate=0.001" in message
  assert "\n" not in message
  problem = threshold_report.grid_problem("--main", str(path), MAIN, LRS)
  assert problem.startswith("--main: ") and members_run.path in problem


# --- the report's files, replaced together ------------------------------------------

def _old_report(out):
  out.mkdir(parents=True, exist_ok=True)
  for name in REPORT:
    (out / name).write_text(f"the old {name}\n")


def _assert_old_report(out):
  assert sorted(os.listdir(out)) == sorted(REPORT)  # no staging folder left either
  for name in REPORT:
    assert (out / name).read_text() == f"the old {name}\n", name


def _driver(code, main, out):
  """The driver run as a program after `code` (Python) patched it."""
  runner = (f"{code}\nimport runpy\nsys.argv = ['threshold_report', '--main={main}', "
            f"'--out={out}']\nrunpy.run_module('experiments.lr_threshold.report', "
            "run_name='__main__')\n")
  return [sys.executable, "-c", "import sys\n" + runner]


FULL_DISK = """
import errno
from attention_jax import files
real = files.atomic_write
def full(path, data):  # the report's text is written, its first figure meets a full disk
  if path.endswith('.png'):
    raise OSError(errno.ENOSPC, 'No space left on device')
  real(path, data)
files.atomic_write = full
"""


def test_a_full_disk_while_the_report_is_written_is_one_line_and_keeps_the_old_report(
    tmp_path):
  # It was a traceback, after the new lr_threshold.md and .json had replaced the old.
  fake.write_run(tmp_path / "main", MAIN, LRS, "dot", 16, 1e-3, [2.0, 2.0])
  out = tmp_path / "out"
  _old_report(out)
  p = subprocess.run(_driver(FULL_DISK, tmp_path / "main", out), cwd=ROOT,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 1 and "Traceback" not in p.stderr
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --out: ") and "No space left on device" in last
  assert str(out) in last and "left as it was" in last
  _assert_old_report(out)


SLOW_PLOTS = """
import os, time
from experiments.lr_threshold import plots as tp
def slow(a, folder):  # a SIGTERM comes after the first figure
  tp.plot_curves(a, os.path.join(folder, tp.CURVES))
  open(os.environ['READY'], 'w').close()
  time.sleep(1)
  tp.plot_heatmaps(a, os.path.join(folder, tp.HEATMAPS))
  tp.plot_lr_star(a, os.path.join(folder, tp.LR_STAR))
  return [tp.CURVES, tp.HEATMAPS, tp.LR_STAR]
tp.plot_all = slow
"""


def test_a_sigterm_while_the_report_is_written_keeps_the_old_report_whole(tmp_path):
  # It left the new lr_threshold.md, .json and lr_curves.png beside the old figures.
  fake.write_run(tmp_path / "main", MAIN, LRS, "dot", 16, 1e-3, [2.0, 2.0])
  out, ready = tmp_path / "out", tmp_path / "ready"
  _old_report(out)
  proc = subprocess.Popen(_driver(SLOW_PLOTS, tmp_path / "main", out), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "READY": str(ready)})
  deadline = time.time() + 300
  while not ready.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  assert ready.exists(), proc.communicate()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 143 and "Traceback" not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith("error: stopped by SIGTERM") and str(out) in last
  _assert_old_report(out)
