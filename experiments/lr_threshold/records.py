"""The threshold report's JSON record: every number of an analysis (`threshold.analyse`),
the rule it was read with, the runs' clocks and the provenances of the rows read."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from experiments.lr_threshold import threshold as th
from experiments.lr_threshold.grids import EARLY_STEP, Cell, Record


def run_clocks(records: Iterable[Record]) -> dict[str, dict]:
  """Per score: the finished runs (a run per cell: its seeds train as one
  program) and the sum of their training clocks in hours, each run counted
  once (the largest of its seeds' rows); runs without a clock are left out."""
  per_cell: dict[Cell, float] = {}
  for r in records:
    if r.train_seconds is not None:
      per_cell[r.cell] = max(per_cell.get(r.cell, 0.0), float(r.train_seconds))
  out: dict[str, dict] = {}
  for c, seconds in sorted(per_cell.items()):
    row = out.setdefault(c.score, {"runs": 0, "hours": 0.0})
    row["runs"] += 1
    row["hours"] += seconds / 3600
  return out


def provenance_summary(records: Iterable[Record]) -> list[dict]:
  """The distinct provenances of the result rows read, each with its number
  of rows (`PROVENANCE_FIELDS`), most rows first; rows not yet finished
  have none and are counted apart by the caller."""
  counts: dict[str, list] = {}
  for r in records:
    if r.provenance is None:
      continue
    key = repr(sorted(r.provenance.items(), key=lambda kv: kv[0]))
    counts.setdefault(key, [dict(r.provenance), 0])[1] += 1
  return [{**p, "rows": n} for p, n in sorted(counts.values(), key=lambda pn: -pn[1])]


def _cell_json(c: Cell) -> dict:
  return {"score": c.score, "dim": c.dim, "lr": c.lr}


def as_json(a: th.Analysis) -> dict:
  """Every number of `a` as JSON-ready values (inf as null beside a flag)."""
  g = a.grid
  return {
      "rule": {"failure_margin": th.FAILURE_MARGIN, "early_step": EARLY_STEP,
               "saturated_share": th.SATURATED_SHARE,
               "last_step": g.steps, "vocab_size": g.vocab_size,
               "bootstrap": {"replicates": th.BOOTSTRAP_REPLICATES,
                             "rng_seed": th.BOOTSTRAP_SEED, "percentiles": list(th.INTERVAL)}},
      "plan": {s: {"dims": list(g.dims[s]), "learning_rates": list(g.learning_rates[s])}
               for s in g.scores},
      "missing": [_cell_json(c) for c in g.missing],
      "records": [{**_cell_json(r.cell), "seed": r.seed,
                   "loss": r.loss if r.loss != math.inf else None, "diverged": r.diverged,
                   "test_bleu": r.test_bleu, "diagnostics": dict(r.diagnostics)}
                  for r in g.records],
      "cells": [{**_cell_json(c), "L": v if math.isfinite(v) else None,
                 "diverged": not math.isfinite(v), "fails_absolute": a.fails[c],
                 "test_bleu": a.test_bleu[c], "diagnostics": a.diagnostics[c]}
                for c, v in sorted(a.losses.items())],
      "L_best": {str(d): v for d, v in sorted(a.best.items())},
      **_fits_json(a),
      "shared_rates": None if a.shared is None else {
          "learning_rates": list(th.shared_rates(g)), **_fits_json(a.shared)},
      "run_clocks": run_clocks(g.records),
      "provenance": provenance_summary(g.records),
      "rows_without_result": sum(r.provenance is None for r in g.records),
  }


def _finite(x: float | None) -> float | None:
  """`x`, or None where it is not finite (an open bracket's end)."""
  return x if x is not None and math.isfinite(x) else None


def _law_json(law: th.Law) -> dict:
  return {"score": law.score, "slope": law.slope, "dims": list(law.dims),
          "interval": [law.interval.low, law.interval.high],
          "replicates": law.interval.replicates,
          "replicates_with_slope": law.interval.with_slope, "reference": law.reference,
          "bracket": None if law.bracket is None else [_finite(v) for v in law.bracket],
          "half_width": _finite(law.half_width),
          "band": None if law.band is None else list(law.band), "verdict": law.verdict,
          "deciding_half_width": law.deciding_half_width,
          "wide": [{"dim": d, "low": _finite(lo) if lo > 0 else None, "high": _finite(hi)}
                   for d, lo, hi in law.wide]}


def _fits_json(a: th.Analysis) -> dict:
  """lr* per (score, d_k), the sensitivities and the laws of `a`, and the
  attention rule's lr_att and laws."""
  return {
      "attention_thresholds": [
          {"score": s, "dim": d, "lr_att": t.lr_att, "bracket": list(t.bracket),
           "below": t.below, "above": t.above, "complete": t.complete, "fitted": t.fitted}
          for (s, d), t in a.attention.items()],
      "attention_laws": [_law_json(law) for law in a.attention_laws.values()],
      "thresholds": [{"score": s, "dim": d, **dataclasses.asdict(t), "censored": t.censored,
                      "fitted": t.fitted} for (s, d), t in a.thresholds.items()],
      "sensitivity": [{"score": s, "dim": d, "sensitivity": v,
                       "complete": a.thresholds[(s, d)].complete}
                      for (s, d), v in a.sensitivity.items()],
      "laws": [_law_json(law) for law in a.laws.values()],
  }
