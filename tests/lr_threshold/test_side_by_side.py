"""experiments.lr_threshold.side_by_side: the two grids' reports read beside each other."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from experiments.lr_threshold import records
from experiments.lr_threshold import side_by_side as sbs
from experiments.lr_threshold import brackets
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise
from tests.lr_threshold.test_threshold_premise import COARSE, _analysis, _rising

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLOROT_DIR = os.path.join(ROOT, "results", "lr_threshold", "transformer_lr_cpu")
PREMISE_DIR = os.path.join(ROOT, "results", "lr_threshold", "transformer_lr_premise_cpu")
LOG16 = math.log(16)


def _row(text: str, *starts: str) -> str:
  prefix = "| " + " | ".join(starts) + " |"
  return next(line for line in text.splitlines() if line.startswith(prefix))


def _reports():
  # Glorot: scaled_dot's lr* in (3.2e-3, 1e-2] at 16 and (1e-3, 3.2e-3] at 256 (slope
  # bracket [-0.83, 0], which holds -1/2); qk_norm never fails.
  glorot = _analysis({
      ("scaled_dot", 16): (_rising(3.2e-3, 1e-2), ()),
      ("scaled_dot", 256): (_rising(1e-3, 3.2e-3), ()),
      ("qk_norm", 16): ({lr: 2.0 for lr in COARSE}, ()),
  })
  # Premise: (1e-2, 3.2e-2] at both (bracket +-0.42, without -1/2), lr_att in
  # (3.2e-3, 1e-2] at 16.
  prem = _analysis({
      ("scaled_dot", 16): (_rising(1e-2, 3.2e-2), (1e-2, 3.2e-2)),
      ("scaled_dot", 256): (_rising(1e-2, 3.2e-2), ()),
  })
  return records.as_json(glorot), records.as_json(prem)


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_page_puts_each_grid_s_numbers_in_its_own_columns():
  glorot, prem = _reports()
  page = sbs.markdown(glorot, prem, {"glorot": "../g", "premise": "."})
  assert sbs.CAVEAT in page  # the two changes cannot be told apart
  # score, d_k, lr* and its point (Glorot, premise), lr_att (Glorot, premise)
  cells = _cells(_row(page, "scaled_dot", "16"))
  assert cells[2] == "(3.2e-3, 1e-2]" and cells[4] == "(1e-2, 3.2e-2]"
  assert cells[6] == "> 3.2e-2" and cells[7] == "(3.2e-3, 1e-2]"
  # qk_norm is only in the Glorot grid: its premise columns are empty.
  cells = _cells(_row(page, "qk_norm", "16"))
  assert cells[2] == "> 3.2e-2" and cells[4:6] == [sbs.MISSING] * 2
  # Slopes, per grid: bracket, half-width, point, band, verdict.
  law = _cells(_row(page, "scaled_dot", "-0.5"))
  assert law[2] == f"[{math.log(1e-3 / 1e-2) / LOG16:+.2f}, +0.00]"
  g = math.log(3.2e-2 / 1e-2) / LOG16
  assert law[7] == f"[{-g:+.2f}, {g:+.2f}]" and law[8] == f"{g:.2f}"
  assert law[6] == brackets.UNRESOLVED and law[11] == brackets.FAILS  # -1/2 inside the one, outside the other
  band = premise.BANDS["scaled_dot"]
  assert law[10] == f"[{band[0]:+.2f}, {band[1]:+.2f}]"
  assert _cells(_row(page, "qk_norm", "+0"))[7:] == [sbs.MISSING] * 5
  # Figures: each grid's, linked relative to the page.
  assert "(../g/lr_curves.png)" in page and "(./max_logit_heatmaps.png)" in page


def test_an_unfinished_curve_is_marked_provisional():
  glorot, prem = _reports()
  prem["thresholds"][0] = {**prem["thresholds"][0], "complete": False}
  prem["attention_thresholds"][0] = {**prem["attention_thresholds"][0], "complete": False}
  s, d = prem["thresholds"][0]["score"], prem["thresholds"][0]["dim"]
  cells = _cells(_row(sbs.markdown(glorot, prem, {"glorot": "g", "premise": "p"}), s, str(d)))
  assert cells[4].endswith("(provisional)") and cells[7].endswith("(provisional)")
  assert "(provisional)" not in cells[2]


def _run(*args, cwd):
  return subprocess.run([sys.executable, "-m", "experiments.lr_threshold.side_by_side", *args],
                        capture_output=True, text=True, cwd=cwd,
                        env={**os.environ, "PYTHONPATH": ROOT}, check=False)


def test_the_command_refuses_a_bad_report_in_one_line_and_writes_nothing(tmp_path):
  glorot, prem = _reports()
  (tmp_path / "g").mkdir()
  (tmp_path / "g" / sbs.REPORT).write_text(json.dumps(glorot))
  (tmp_path / "p").mkdir()
  (tmp_path / "p" / sbs.REPORT).write_text('{"laws": []}')  # not a whole report
  out = tmp_path / "page.md"
  for args, said in (
      (["--glorot=g", "--premise=nowhere"], "--premise: no folder 'nowhere'"),
      (["--glorot=g", "--premise=p"], "--premise: 'p/lr_threshold.json' is not a threshold report"),
      (["--glorot=p/..", "--premise=g"], "--glorot: 'p/../lr_threshold.json' does not exist"),
  ):
    result = _run(*args, f"--out={out}", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr
    assert not out.exists()
  result = _run("--glorot=g", "--premise=g", f"--out={tmp_path}", cwd=tmp_path)
  assert "--out:" in result.stderr and "is a folder" in result.stderr
  (tmp_path / "p" / sbs.REPORT).write_text(json.dumps(prem))
  result = _run("--glorot=g", "--premise=p", "--out=p/page.md", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "(../g/lr_curves.png)" in (tmp_path / "p" / "page.md").read_text()


def test_the_committed_page_is_what_the_committed_reports_say():
  """side_by_side.md, as `commands.sh copy` writes it, from the reports now in
  results/ (the Glorot grid's refined report once every cell of it is known,
  its committed one before)."""
  refined = os.path.join(GLOROT_DIR, "refined")
  glorot_dir = sbs.glorot_folder(GLOROT_DIR, refined if os.path.isdir(refined) else "")
  page = sbs.markdown(sbs.read_report("--glorot", glorot_dir),
                      sbs.read_report("--premise", PREMISE_DIR),
                      {"glorot": os.path.relpath(glorot_dir, PREMISE_DIR), "premise": "."})
  with open(os.path.join(PREMISE_DIR, "side_by_side.md"), encoding="utf-8") as f:
    assert f.read() == page


def test_the_refined_glorot_report_is_shown_only_once_complete(tmp_path):
  """--glorot_refined takes the place of --glorot once its report has no
  missing cell; before, and without one, the committed report is shown; an
  unreadable refined report is one line naming its flag."""
  committed, refined = tmp_path / "g", tmp_path / "r"
  for folder in (committed, refined):
    folder.mkdir()
  report = {key: [] for key in sbs._KEYS}  # pylint: disable=protected-access
  (committed / sbs.REPORT).write_text(json.dumps(report))
  (refined / sbs.REPORT).write_text(json.dumps({**report, "missing": [["dot", 16, 0.0056]]}))
  assert sbs.glorot_folder(str(committed), str(refined)) == str(committed)
  assert sbs.glorot_folder(str(committed), "") == str(committed)
  (refined / sbs.REPORT).write_text(json.dumps(report))
  assert sbs.glorot_folder(str(committed), str(refined)) == str(refined)
  (refined / sbs.REPORT).write_text("{")
  with pytest.raises(ValueError, match="--glorot_refined: cannot read"):
    sbs.glorot_folder(str(committed), str(refined))
