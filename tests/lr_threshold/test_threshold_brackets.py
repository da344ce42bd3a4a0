"""The model-free brackets of lr* and of the slope (`threshold.slope_bracket`),
and the verdict that says no more than a bracket allows (`threshold.verdict`),
on curves made by hand: every answer is worked out in the comments."""

import json
import math
import pathlib
import re

import numpy as np
import pytest

from experiments.lr_threshold import brackets
from experiments.lr_threshold import threshold as th
from experiments.lr_threshold import grids
from experiments.lr_threshold import tables as threshold_tables
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise

MARGIN = th.FAILURE_MARGIN
LOG16 = math.log(16)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _read(path: str) -> str:
  return (ROOT / path).read_text(encoding="utf-8")


def _quoted_bracket(law: dict, readme: str, grid_readme: str, docstring: str) -> str:
  """The law's slope bracket as the Markdown documents write it (with "−"),
  asserted to be in the README and the grid's README, and with "-" in the
  preset's docstring."""
  low, high = (threshold_tables.fmt_signed(x) for x in law["bracket"])
  for text, minus in ((readme, "−"), (grid_readme, "−"), (docstring, "-")):
    assert f"[{low}, {high}]".replace("-", minus) in text, (law["score"], low, high)
  return f"[{low}, {high}]".replace("-", "−")


def test_lr_star_bracket_is_the_last_passing_and_first_failing_rate():
  planned = (1e-4, 1e-3, 3e-3, 1e-2)
  t = th.threshold([(1e-4, 2.1), (1e-3, 2.0), (3e-3, 2.0 + MARGIN / 2), (1e-2, 2.0 + 2 * MARGIN)],
                   planned)
  assert t.bracket == (3e-3, 1e-2) and 3e-3 < t.lr_star < 1e-2
  above = th.threshold([(1e-4, 2.1), (1e-3, 2.0), (3e-3, 2.05), (1e-2, 2.1)], planned)
  assert above.above and above.bracket == (1e-2, None)
  into = th.threshold([(1e-4, 2.1), (1e-3, 2.0), (3e-3, 2.05), (1e-2, math.inf)], planned)
  assert into.into_divergence and into.bracket == (3e-3, 1e-2)
  assert th.threshold([(1e-4, math.inf), (1e-3, math.inf)], planned).bracket is None


def test_slope_bracket_takes_each_lr_star_at_an_end_of_its_interval():
  # Every lr* in (3e-3, 1e-2]: the slope from 16 to 256 is at most log(10/3)/log 16.
  same = [(d, 3e-3, 1e-2) for d in (16, 64, 256)]
  low, high = brackets.slope_bracket(same)
  assert high == pytest.approx(math.log(10 / 3) / LOG16) and low == pytest.approx(-high)
  assert high == pytest.approx(0.434, abs=1e-3)
  # The middle d_k carries no weight in a least-squares slope over three
  # evenly spaced log d_k: its interval does not matter.
  wide_middle = [(16, 3e-3, 1e-2), (64, 1e-5, 1.0), (256, 3e-3, 1e-2)]
  assert brackets.slope_bracket(wide_middle) == pytest.approx((low, high))
  # Quarter-decade intervals at both ends: half-width log(10^0.25)/log 16 = 0.21.
  q = 10 ** 0.25
  b = brackets.slope_bracket([(16, 1e-2, 1e-2 * q), (64, 5e-3, 5e-3 * q), (256, 2.5e-3, 2.5e-3 * q)])
  assert (b[1] - b[0]) / 2 == pytest.approx(0.25 * math.log(10) / LOG16)
  assert (b[1] - b[0]) / 2 == pytest.approx(0.2076, abs=1e-4)
  assert brackets.slope_bracket([(16, 1e-3, 1e-2)]) is None


def test_slope_bracket_contains_every_slope_of_points_inside_the_intervals():
  rng = np.random.default_rng(0)
  intervals = [(16, 1e-3, 5e-3), (64, 2e-3, 3e-3), (256, 1e-4, 1e-3)]
  low, high = brackets.slope_bracket(intervals)
  for _ in range(500):
    points = [(d, math.exp(rng.uniform(math.log(lo), math.log(hi)))) for d, lo, hi in intervals]
    assert low - 1e-12 <= th.slope(points) <= high + 1e-12
  ends = [(d, lo if d == 16 else hi) for d, lo, hi in intervals]  # the largest, by hand
  assert th.slope(ends) == pytest.approx(high)


@pytest.mark.parametrize("bracket, band, said", [
    ((-0.43, 0.43), None, brackets.FAILS),             # excludes -1
    ((-1.2, -0.8), None, brackets.UNRESOLVED),          # contains -1; no band registered
    ((-1.2, -0.8), (-1.25, -0.75), brackets.HOLDS),
    ((-1.3, -0.8), (-1.25, -0.75), brackets.UNRESOLVED),
    ((-0.9, -0.6), (-1.25, -0.75), brackets.FAILS),     # inside the band, but excludes -1
])
def test_verdict(bracket, band, said):
  assert brackets.verdict(bracket, -1.0, band) == said


def test_deciding_half_width():
  # Point -0.9, band [-1.25, -0.75]: it excludes -1 below 0.1, lies inside the band
  # below 0.15: refining decides at 0.15.
  assert brackets.deciding_half_width(-0.9, -1.0, (-1.25, -0.75)) == pytest.approx(0.15)
  assert brackets.deciding_half_width(-0.5, -1.0, (-1.25, -0.75)) == pytest.approx(0.5)
  assert brackets.deciding_half_width(-0.9, -1.0, None) is None


def _grid(curves, planned):
  """A Grid of one score (scaled_dot), two identical seeds per cell."""
  records = []
  for dim, losses in curves.items():
    for lr, loss in zip(planned, losses):
      for seed in (0, 1):
        records.append(grids.Record("scaled_dot", dim, lr, seed, loss, False, 10.0, {}))
  return grids.Grid(tuple(records), (), {"scaled_dot": planned},
                 {"scaled_dot": tuple(sorted(curves))}, 2000, 1000)


def test_a_grid_whose_interpolated_slope_excludes_the_prediction_is_unresolved_by_its_bracket():
  # Half-decade-wide brackets (1e-3, 1e-2] at every d_k; the interpolation puts lr*
  # at 9e-3, ~5.2e-3 and 3e-3: slope log(3/9)/log 16 = -0.40, and identical seeds
  # make the bootstrap interval that point. The point and its interval exclude
  # scaled_dot's -1/2; the bracket, +-log 10/log 16 = +-0.83, contains it.
  planned = (1e-4, 1e-3, 1e-2)
  curves = {}
  for dim, star in ((16, 9e-3), (64, math.sqrt(9e-3 * 3e-3)), (256, 3e-3)):
    t = math.log(star / 1e-3) / math.log(10)  # where in the interval the target is met
    curves[dim] = (2.2, 2.0, 2.0 + MARGIN / t)
  a = th.analyse(_grid(curves, planned), replicates=50)
  law = a.laws["scaled_dot"]
  assert law.slope == pytest.approx(math.log(3 / 9) / LOG16, abs=1e-6)
  assert law.interval.low == pytest.approx(law.slope) == law.interval.high
  assert not law.interval.low <= -0.5 <= law.interval.high  # the bootstrap would exclude it
  assert law.bracket == pytest.approx((-math.log(10) / LOG16, math.log(10) / LOG16))
  assert law.verdict == brackets.UNRESOLVED
  table = threshold_tables.law_table(a)
  row = next(line for line in table.splitlines() if line.startswith("| scaled_dot"))
  assert "not resolved by this grid" in row and "[-0.83, +0.83]" in row and "-0.40" in row
  # With a band registered, it names the half-width that would decide: with the
  # slope p = -0.396, max(|p + 0.5|, min(p + 0.75, -0.25 - p)) = -0.25 - p = 0.146.
  banded = th.analyse(_grid(curves, planned), replicates=50,
                      bands={"scaled_dot": (-0.75, -0.25)}).laws["scaled_dot"]
  assert banded.verdict == brackets.UNRESOLVED
  assert banded.deciding_half_width == pytest.approx(-0.25 - law.slope)
  # The same lr* on a grid a quarter-decade fine around them would decide: the
  # brackets (5.6e-3, 1e-2] at 16 and (1.8e-3, 3.2e-3] at 256 give a half-width of
  # (log(10/5.6) + log(3.2/1.8)) / 2 / log 16 = 0.21, about -0.40: [-0.61, -0.19],
  # still reaching outside the band: unresolved, not holds.
  fine = (5.6e-4, 1e-3, 1.8e-3, 3.2e-3, 5.6e-3, 1e-2)
  fine_curves = {}
  for dim, star in ((16, 9e-3), (64, math.sqrt(9e-3 * 3e-3)), (256, 3e-3)):
    fine_curves[dim] = (2.1,) + tuple(2.0 + MARGIN * math.log(lr / 1e-3) / math.log(star / 1e-3)
                                      for lr in fine[1:])
  a = th.analyse(_grid(fine_curves, fine), replicates=10, bands={"scaled_dot": (-0.75, -0.25)})
  law = a.laws["scaled_dot"]
  assert law.bracket[0] < -0.5 < law.bracket[1]
  assert law.half_width == pytest.approx((math.log(1e-2 / 5.6e-3) + math.log(3.2e-3 / 1.8e-3))
                                         / 2 / LOG16, abs=1e-3)
  assert law.verdict == brackets.UNRESOLVED


def test_the_readmes_state_the_committed_brackets_and_no_stronger_claim():
  """The README and the grid's own README quote each dot product's slope bracket
  from the committed report, and no longer say the law "does not hold" on the
  strength of the interpolated slopes."""
  import json
  import pathlib
  root = pathlib.Path(__file__).resolve().parents[2]
  report = json.loads((root / "results/lr_threshold/transformer_lr_cpu/lr_threshold.json").read_text())
  laws = {law["score"]: law for law in report["laws"]}
  texts = [(root / p).read_text(encoding="utf-8")
           for p in ("README.md", "results/lr_threshold/transformer_lr_cpu/README.md")]
  for score in ("dot", "scaled_dot"):
    low, high = laws[score]["bracket"]
    quoted = f"{low:+.2f}".replace("-", "−").lstrip("+"), f"{high:+.2f}"
    for text in texts:
      assert f"{quoted[0]} to {quoted[1]}" in text or f"[{quoted[0]}, {quoted[1]}]" in text
  for text in texts:
    assert "The predicted law for its threshold lr* (a μP-style argument for Adam) does not " \
           "hold" not in text
    assert "The prediction does not hold for the two dot products" not in text


def test_the_report_names_the_cells_that_keep_a_bracket_wider_than_the_ladder():
  # A quarter-decade step is 0.243-0.255 decades once rounded (1.8, 3.2, 5.6): not wide.
  intervals = [(16, 1e-2, 3.2e-2), (64, 1e-3, 1.8e-3), (128, 5.6e-3, 1e-2), (256, 3.2e-2, math.inf),
               (1024, 0.0, 1e-4)]
  wide = brackets.wide_intervals(intervals)
  assert [d for d, _, _ in wide] == [16, 256, 1024]
  assert threshold_tables.fmt_wide(wide) == "16: (1e-2, 3.2e-2]; 256: > 3.2e-2; 1024: <= 1e-4"
  assert threshold_tables.fmt_wide(()) == "none"
  # On a grid: half-decade brackets at every d_k are all named; a quarter-decade grid none.
  planned = (1e-4, 1e-3, 1e-2)
  curves = {dim: (2.2, 2.0, 2.0 + 2 * MARGIN) for dim in (16, 64, 256)}
  law = th.analyse(_grid(curves, planned), replicates=10).laws["scaled_dot"]
  assert law.wide == tuple((d, 1e-3, 1e-2) for d in (16, 64, 256))
  row = next(line for line in threshold_tables.law_table(
      th.analyse(_grid(curves, planned), replicates=10)).splitlines()
             if line.startswith("| scaled_dot"))
  assert row.rstrip(" |").endswith("16: (1e-3, 1e-2]; 64: (1e-3, 1e-2]; 256: (1e-3, 1e-2]")
  fine = (5.6e-4, 1e-3, 1.8e-3, 3.2e-3)  # lr* in (1.8e-3, 3.2e-3] at both
  curves = {dim: (2.1, 2.0, 2.0 + MARGIN / 2, 2.0 + 2 * MARGIN) for dim in (16, 256)}
  law = th.analyse(_grid(curves, fine), replicates=10).laws["scaled_dot"]
  assert law.bracket == pytest.approx((-math.log(3.2 / 1.8) / LOG16, math.log(3.2 / 1.8) / LOG16))
  assert law.wide == ()


def test_the_premise_grids_verdicts_are_quoted_from_its_committed_report():
  """Each score's slope bracket and verdict in the README, the grid's README and
  the preset's docstring are those of the committed premise report, the
  verdict in the preset's words ("fails under its premise", "holds under its
  premise"); none of them calls a verdict the report does not give."""
  here = "results/lr_threshold/transformer_lr_premise_cpu"
  report = json.loads(_read(f"{here}/lr_threshold.json"))
  assert report["missing"] == []  # the verdict is quoted from a finished grid only
  laws = {law["score"]: law for law in report["laws"]}
  docstring = premise.__doc__
  words = {brackets.HOLDS: "holds under its premise", brackets.FAILS: "fails under its premise"}
  readme, grid_readme = _read("README.md"), _read(f"{here}/README.md")
  for score, law in laws.items():
    _quoted_bracket(law, readme, grid_readme, docstring)
    # The grid's README: the verdict word for word in the score's table row.
    row = next(line for line in grid_readme.splitlines() if line.startswith(f"| `{score}` |"))
    assert row.endswith(f"| **{words[law['verdict']]}** |"), row
    assert f"{words[law['verdict']]}" in " ".join(docstring.split())
  # The README's one paragraph names the dot products that fail and the control that holds.
  failing = sorted(s for s, law in laws.items() if law["verdict"] == brackets.FAILS)
  holding = sorted(s for s, law in laws.items() if law["verdict"] == brackets.HOLDS)
  names = lambda scores: " and ".join(f"`{s}`" for s in scores)
  assert (f"**Under its premise the law fails for {names(failing)} and holds for "
          f"{names(holding)}**") in readme


def test_the_glorot_refinements_verdicts_are_quoted_from_its_committed_report():
  """Once the refined Glorot report has every planned cell, the README, that
  grid's README and the premise preset's docstring quote its `dot` and
  `scaled_dot` brackets and verdicts, and none of them still calls the
  refinement "training"."""
  glorot = "results/lr_threshold/transformer_lr_cpu"
  report = json.loads(_read(f"{glorot}/refined/lr_threshold.json"))
  assert report["missing"] == []
  laws = {law["score"]: law for law in report["laws"] if law["score"] in ("dot", "scaled_dot")}
  assert len(laws) == 2
  readme, grid_readme = _read("README.md"), _read(f"{glorot}/README.md")
  docstring = " ".join(premise.__doc__.split())
  for score, law in laws.items():
    bracket = _quoted_bracket(law, readme, grid_readme, docstring)
    row = next(line for line in grid_readme.splitlines()
               if line.startswith(f"| `{score}` |") and bracket in line)
    assert f"| **{law['verdict']}**" in row, row
  for text in (readme, grid_readme, docstring, _read("results/README.md"),
               _read("results/lr_threshold/transformer_lr_premise_cpu/README.md")):
    said = re.search(r"refinement[^.|]{0,60}\btraining\b", " ".join(text.split()), re.IGNORECASE)
    assert said is None, said.group(0)
