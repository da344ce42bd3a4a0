"""The launch check's pure parts: its prediction, row merging and table (no compile),
and its flags, refused in one line before any work."""

import os
import re
import subprocess
import sys

import pytest

from experiments.compile_check import launch_check


def _row(case, variant, launches, steps=6000):
  return {"case": case, "variant": variant, "kernels": 17114, "thunk_kernels": 15040,
          "launches": launches, "command_buffers": 646, "host_iterations": 480,
          "predicted_s": 0.1086, "roofline_s": 0.0522, "steps": steps,
          "predicted_launch_s": launch_check.predicted_launch_seconds(
              {"roofline_s": 0.0522, "launches": launches, "host_iterations": 480},
              3e-6, 10e-6)}


def test_predicted_launch_seconds_counts_launches_and_host_iterations():
  row = {"roofline_s": 0.05, "launches": 1000, "host_iterations": 480}
  assert abs(launch_check.predicted_launch_seconds(row, 3e-6, 10e-6) - 0.0578) < 1e-12


def test_merge_replaces_the_same_case_and_variant_only():
  rows = [_row("additive d=1024", "default", 7773), _row("additive d=1024", "while_loops", 10)]
  merged = launch_check.merge(rows, _row("additive d=1024", "default", 7000))
  assert sorted(r["launches"] for r in merged) == [10, 7000]


def test_table_marks_the_measured_cell_and_sums_the_sweep_only_when_whole():
  rows = [dict(_row("additive d=1024", "default", 7773), commit="f0c83c5+dirty")]
  text = launch_check.table(rows)
  assert "| 7,773 |" in text and "21-23 ms (H200, per-step code" in text
  # the same cell compiled at another commit is another program: no measurement
  assert "H200" not in launch_check.table([dict(rows[0], commit="d4095aa")])
  assert "H200" not in launch_check.table([_row("additive d=1024", "default", 7773)])
  assert "predicted at" not in text  # one cell of 12: no sweep total
  whole = [_row(f"additive d={d}", "default", 7773) for d in (128, 256, 512, 1024)] * 3
  for i, r in enumerate(whole):
    r["case"] = f"{['additive', 'multiplicative', 'scaled'][i // 4]} d={[128, 256, 512, 1024][i % 4]}"
  total = 12 * 6000 * (0.0522 + 7773 * 3e-6 + 480 * 10e-6) / 60
  assert f"predicted at {total:.1f} min" in launch_check.table(whole)


# --- flags checked before any work ---------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CELLS = ["additive d=128", "additive d=1024", "multiplicative d=128"]


def test_the_cases_are_the_gpu_presets_12_cells():
  names = launch_check.case_names()
  assert len(names) == 12 and "additive d=1024" in names and "scaled_multiplicative d=128" in names


def test_flags_that_name_cases_are_kept_in_order(tmp_path):
  assert launch_check.check_flags(str(tmp_path), "default", "additive d=1024, additive d=128",
                                  False, CELLS) == ["additive d=1024", "additive d=128"]
  assert launch_check.check_flags(str(tmp_path / "new"), "default", "", False, CELLS) == []


@pytest.mark.parametrize("setup, kwargs, needle", [
    (None, dict(cases="additve d=1024"), "`--cases`: 'additve d=1024' is not a gpu_sweep case"),
    (None, dict(cases=" , "), "`--cases` names no case"),
    ("file", dict(), "exists and is not a folder"),
    (None, dict(out=""), "`--out` is required"),
    (None, dict(variant="fast"), "`--variant` must be one of"),
    (None, dict(report_only=True), "`--report_only`: `--out`"),
])
def test_each_bad_flag_is_one_error_naming_it(tmp_path, setup, kwargs, needle):
  out = tmp_path / "out"
  if setup == "file":
    out.write_text("")
  given = dict(out=str(out), variant="default", cases="", report_only=False, known=CELLS)
  given.update(kwargs)
  with pytest.raises(ValueError, match=re.escape(needle)):
    launch_check.check_flags(**given)
  assert setup == "file" or not out.exists()  # nothing made


def test_a_misspelt_case_stops_the_command_in_one_line_before_any_work(tmp_path):
  """It was a 27-line traceback here, and in the AOT environment compiled
  nothing and exited 0."""
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "experiments.compile_check.launch_check", f"--out={out}",
                         "--cases=additve d=1024"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
  assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
  assert lines[0].startswith("error: `--cases`: 'additve d=1024'")
  assert not out.exists()
