r"""The two learning-rate grids of the 1/d_k law, read side by side.

    python -m experiments.lr_threshold.side_by_side \
        --glorot=results/lr_threshold/transformer_lr_cpu \
        --glorot_refined=results/lr_threshold/transformer_lr_cpu/refined \
        --premise=results/lr_threshold/transformer_lr_premise_cpu \
        --out=results/lr_threshold/transformer_lr_premise_cpu/side_by_side.md

reads the `lr_threshold.json` that `experiments.lr_threshold.report` wrote for
each grid (the Glorot, post-LN grid of `transformer_lr_cpu`: its refined report
once every cell of it is known, its committed one before; the premise, pre-LN grid of `transformer_lr_premise_cpu`) and writes
one Markdown page: lr* (grid interval and interpolated point) and lr_att per
(score, d_k), each slope's bracket, point, band and verdict, a column per grid,
and the two reports' curves and heat maps beside each other. Nothing is
recomputed: every cell is a number of one of the two reports, so the page says
what they say, no more.

The grids differ in two things at once, the initialisation of W_Q and W_K and
the LayerNorm's place; the page says so above its tables, since no difference
between its columns can be put down to one of them. Each verdict stands within
its own grid, judged with the bands registered for it.

A bad flag, a missing or unreadable report is one `error:` line naming it,
before anything is written; --out is replaced whole or left as it was.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Sequence

from absl import app
from absl import flags

from attention_jax import files
from attention_jax.analysis import tables as analysis_tables
from experiments.lr_threshold import tables as threshold_tables

FLAGS = flags.FLAGS
REPORT = "lr_threshold.json"
FIGURES = (("lr_curves.png", "final validation loss and test BLEU against the learning rate"),
           ("max_logit_heatmaps.png", "largest self-attention logit over (learning rate, d_k)"))
SCORE_ORDER = ("dot", "scaled_dot", "inverse_dim", "qk_norm")
GRIDS = (("glorot", "Glorot, post-LN"), ("premise", "premise, pre-LN"))
MISSING = threshold_tables.MISSING
CAVEAT = (
    "The two grids differ in two things at once: how W_Q and W_K are initialised "
    "(Glorot, fan-average over H·d_k outputs, against `--qk_init=premise`, whose query and "
    "key coordinates have unit variance at every d_k) and where the LayerNorm sits (post-LN "
    "against pre-LN). No difference between a Glorot column and a premise column can be put "
    "down to one of the two changes; each verdict stands within its own grid, with the bands "
    "registered for it.")
_KEYS = ("thresholds", "laws", "attention_thresholds", "attention_laws", "missing")


def read_report(flag: str, folder: str) -> dict:
  """The report `folder/lr_threshold.json`; a ValueError of one line names
  `flag` and what is wrong with it."""
  path = os.path.join(folder, REPORT)
  if not os.path.isdir(folder):
    raise ValueError(f"{flag}: no folder {folder!r}.")
  try:
    with open(path, encoding="utf-8") as f:
      report = json.load(f)
  except FileNotFoundError:
    raise ValueError(f"{flag}: {path!r} does not exist; write it with "
                     "`python -m experiments.lr_threshold.report`.") from None
  except (OSError, ValueError) as e:
    raise ValueError(f"{flag}: cannot read {path!r}: {e}") from None
  lacking = [k for k in _KEYS if not isinstance(report, dict) or k not in report]
  if lacking:
    raise ValueError(f"{flag}: {path!r} is not a threshold report (no {', '.join(lacking)}).")
  return report


def _scores(*reports: dict) -> list[str]:
  found = {row["score"] for r in reports for row in r["thresholds"]}
  return [s for s in SCORE_ORDER if s in found] + sorted(found - set(SCORE_ORDER))


def _by_cell(rows: Sequence[dict]) -> dict[tuple[str, int], dict]:
  return {(row["score"], row["dim"]): row for row in rows}


def _by_score(rows: Sequence[dict]) -> dict[str, dict]:
  return {row["score"]: row for row in rows}


def _slope_range(pair: Sequence[float | None] | None) -> str:
  """A JSON slope bracket, whose open ends were written as null."""
  if pair is None:
    return MISSING
  low, high = (-math.inf if pair[0] is None else pair[0], math.inf if pair[1] is None else pair[1])
  return f"[{threshold_tables.fmt_signed(low)}, {threshold_tables.fmt_signed(high)}]"


def _verdict(law: dict | None) -> str:
  if law is None or law.get("verdict") is None:
    return MISSING
  return law["verdict"]


def _star(row: dict | None) -> str:
  if row is None:
    return MISSING
  return MISSING if row.get("lr_star") is None else threshold_tables.fmt_lr(row["lr_star"])


def _interval(row: dict | None) -> str:
  """A threshold's grid interval, `(provisional)` where rates of its curve are
  not yet known."""
  if row is None:
    return MISSING
  text = threshold_tables.fmt_bracket(row["bracket"])
  return text if row.get("complete", True) or text == MISSING else f"{text} (provisional)"


def threshold_rows(glorot: dict, premise: dict) -> list[list[str]]:
  """A row per (score, d_k) either grid has: lr* in its grid interval and
  interpolated, then lr_att's grid interval, Glorot before premise."""
  stars = [_by_cell(r["thresholds"]) for r in (glorot, premise)]
  att = [_by_cell(r["attention_thresholds"]) for r in (glorot, premise)]
  rows = []
  for s in _scores(glorot, premise):
    dims = sorted({d for table in stars for (t, d) in table if t == s})
    for d in dims:
      row = [s, str(d)]
      for table in stars:
        t = table.get((s, d))
        row += [_interval(t), _star(t)]
      for table in att:
        t = table.get((s, d))
        row.append(_interval(t))
      rows.append(row)
  return rows


def law_rows(glorot: dict, premise: dict, key: str) -> list[list[str]]:
  """A row per score: the prediction, then per grid the slope bracket, its
  half-width, the interpolated slope (lr* only), the band and the verdict."""
  laws = [_by_score(r[key]) for r in (glorot, premise)]
  rows = []
  for s in _scores(glorot, premise):
    reference = next((t[s]["reference"] for t in laws if s in t and
                      t[s].get("reference") is not None), None)
    row = [s, MISSING if reference is None else f"{reference:+g}"]
    for table in laws:
      law = table.get(s)
      bracket = None if law is None else law.get("bracket")
      half = None if law is None else law.get("half_width")
      row += [_slope_range(bracket), MISSING if bracket is None else
              ("inf" if half is None else f"{half:.2f}")]
      if key == "laws":
        slope = None if law is None else law.get("slope")
        row.append(MISSING if slope is None else threshold_tables.fmt_signed(slope))
      band = None if law is None else law.get("band")
      row += [MISSING if law is None else _slope_range(band) if band else "none registered",
              _verdict(law)]
    rows.append(row)
  return rows


def _state(report: dict) -> str:
  missing = len(report["missing"])
  # "so far": an adaptive grid's rule may still plan more (its report's --plan says).
  return ("every cell planned so far is known" if not missing
          else f"{missing} planned cells not yet known")


def _provenance(name: str, report: dict, link: str) -> str:
  made = report.get("analysed_at") or {}
  runs = sorted({str(p.get("commit") or "?")[:7] for p in report.get("provenance", [])})
  return (f"- {name}: [{link}]({link}), analysed at {str(made.get('commit') or '?')[:7]} from "
          f"runs at {', '.join(runs) or MISSING}; {_state(report)}.")


def markdown(glorot: dict, premise: dict, links: dict[str, str]) -> str:
  """The page; `links`: each grid's report folder relative to the page."""
  g_name, p_name = (label for _, label in GRIDS)
  parts = ["# The 1/d_k law: the Glorot grid and the premise grid side by side", "",
           "Written by `python -m experiments.lr_threshold.side_by_side` from the two "
           "reports below; every cell is a number of one of them.", "",
           _provenance(g_name, glorot, links["glorot"] + "/" + REPORT),
           _provenance(p_name, premise, links["premise"] + "/" + REPORT), "", CAVEAT, ""]
  parts += ["## lr* (loss rule: L reaches L(lr_opt) + ln 1.2) and lr_att (attention rule)", "",
            analysis_tables.markdown(
                ["score", "d_k", f"lr* in ({g_name})", "interpolated", f"lr* in ({p_name})",
                 "interpolated", f"lr_att in ({g_name})", f"lr_att in ({p_name})"],
                threshold_rows(glorot, premise))]
  per_grid = ["slope bracket", "half-width", "interpolated", "band", "verdict"]
  parts += ["## Slope of log lr* on log d_k (brackets: grid intervals, no interpolation)", "",
            analysis_tables.markdown(
                ["score", "predicted"] + [f"{h} ({name})" for _, name in GRIDS
                                          for h in per_grid],
                law_rows(glorot, premise, "laws"))]
  per_grid = ["slope bracket", "half-width", "band", "verdict"]
  parts += ["## Slope of log lr_att on log d_k", "",
            analysis_tables.markdown(
                ["score", "predicted"] + [f"{h} ({name})" for _, name in GRIDS
                                          for h in per_grid],
                law_rows(glorot, premise, "attention_laws"))]
  figures = [[f"![{alt}, {name}]({links[key]}/{png})" for key, name in GRIDS]
             for png, alt in FIGURES]
  parts += ["## Curves and heat maps", "",
            analysis_tables.markdown([name for _, name in GRIDS], figures)]
  return "\n".join(parts)


def define_flags() -> None:
  flags.DEFINE_string("glorot", None, "Folder of the Glorot grid's report (its lr_threshold.json).")
  flags.DEFINE_string("glorot_refined", "", "Folder of the Glorot grid's refined report, set "
                      "beside the premise grid's in place of --glorot once every cell of it "
                      "is known.")
  flags.DEFINE_string("premise", None, "Folder of the premise grid's report.")
  flags.DEFINE_string("out", None, "The page to write (a .md file; replaced whole).")


def glorot_folder(committed: str, refined: str) -> str:
  """The folder of the Glorot report to show: `refined` once every cell of it
  is known (its `missing` list empty), `committed` before (or with no
  `refined`), so that the page never sets a provisional report without
  verdicts beside the premise grid's. An unreadable `refined` report is a
  ValueError of one line naming --glorot_refined."""
  if refined and not read_report("--glorot_refined", refined)["missing"]:
    return refined
  return committed


def out_problem(out: str | None) -> str | None:
  if not out:
    return "--out: give the page to write, e.g. --out=side_by_side.md."
  if os.path.isdir(out):
    return f"--out: {out!r} is a folder; give the page's file name."
  parent = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(parent):
    return f"--out: no folder {parent!r} to write {os.path.basename(out)!r} into."
  return None


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  problem = out_problem(FLAGS.out)
  if problem:
    sys.exit(f"error: {problem}")
  try:
    folders = {"glorot": glorot_folder(FLAGS.glorot or "", FLAGS.glorot_refined),
               "premise": FLAGS.premise or ""}
    reports = {key: read_report(f"--{key}", folders[key]) for key, _ in GRIDS}
  except ValueError as e:
    sys.exit(f"error: {e}")
  here = os.path.dirname(os.path.abspath(FLAGS.out))
  links = {key: os.path.relpath(folders[key], here) for key, _ in GRIDS}
  try:
    files.atomic_write(FLAGS.out, markdown(reports["glorot"], reports["premise"], links))
  except OSError as e:
    sys.exit(f"error: --out: cannot write {FLAGS.out!r}: {e.strerror or e}; it is left as it was.")
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
