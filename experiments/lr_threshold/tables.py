"""The Markdown tables of the learning-rate threshold analysis (`threshold.analyse`).

Tables only, each under a heading that names what its cells hold: the prose
that reads them is written by a person in the results README, so that no
generated sentence can claim more than the numbers.
"""

from __future__ import annotations

import math
from typing import Sequence

from attention_jax.analysis import tables as analysis_tables
from experiments.lr_threshold import brackets
from experiments.lr_threshold import grids
from experiments.lr_threshold import records
from experiments.lr_threshold import threshold as th

MISSING = "–"


def fmt_lr(lr: float) -> str:
  """A learning rate in two significant digits, as `3e-5`, `1.7e-3`."""
  mantissa, _, exponent = f"{lr:.1e}".partition("e")
  return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _loss(v: float) -> str:
  return f"{v:.3f}" if math.isfinite(v) else "diverged"


def _all_dims(a: th.Analysis) -> list[int]:
  return sorted({d for s in a.grid.scores for d in a.grid.dims[s]})


def loss_table(a: th.Analysis) -> str:
  """L(s, d, lr) (nats; `diverged`: a seed diverged), a row per (score, lr),
  a column per d_k."""
  dims = _all_dims(a)
  diverged_seeds = {}
  for r in a.grid.records:
    diverged_seeds[r.cell] = diverged_seeds.get(r.cell, 0) + r.diverged
  rows = []
  for s in a.grid.scores:
    for lr in a.grid.learning_rates[s]:
      row = [s, fmt_lr(lr)]
      for d in dims:
        c = grids.Cell(s, d, lr)
        v = a.losses.get(c)
        if v is None:
          row.append(MISSING)
        elif math.isfinite(v):
          row.append(_loss(v))
        else:
          n = sum(1 for r in a.grid.records if r.cell == c)
          row.append(f"diverged ({diverged_seeds[c]} of {n} seeds)")
      rows.append(row)
  return analysis_tables.markdown(["score", "lr"] + [f"d_k = {d}" for d in dims], rows)


def _flags(t: th.Threshold) -> str:
  flags = []
  if t.nowhere:
    flags.append("diverged at every lr")
  if t.above:
    flags.append("censored: above the grid")
  if t.lowest:
    flags.append("censored: lr_opt is the grid's lowest")
  if t.into_divergence:
    flags.append("next lr diverged: lr* is the last lr below the target")
  if not t.complete:
    flags.append("provisional: lrs missing")
  return "; ".join(flags)


def threshold_table(a: th.Analysis) -> str:
  """lr_opt, L(lr_opt) and lr* per (score, d_k), with the flags that keep an
  lr* out of the fit."""
  rows = []
  for s in a.grid.scores:
    for d in a.grid.dims[s]:
      t = a.thresholds.get((s, d))
      if t is None:
        rows.append([s, str(d), MISSING, MISSING, MISSING, "no cell known"])
        continue
      if t.lr_star is not None:
        star = fmt_lr(t.lr_star)
      elif t.above:
        star = f"> {fmt_lr(max(a.grid.planned(s, d)))}"
      else:
        star = f"< {fmt_lr(min(a.grid.planned(s, d)))}"
      rows.append([s, str(d), fmt_lr(t.lr_opt) if t.lr_opt else MISSING,
                   _loss(t.loss_opt) if t.loss_opt is not None else MISSING,
                   fmt_bracket(t.bracket), star,
                   _flags(t) or ("fitted" if t.fitted else "")])
  return analysis_tables.markdown(
      ["score", "d_k", "lr_opt", "L(lr_opt)", "lr* in (grid interval)", "lr* interpolated",
       "flags"], rows)


def fmt_bracket(bracket: Sequence[float | None] | None) -> str:
  """The grid interval that holds lr* or lr_att, `(3e-3, 1e-2]`: `> 1e-2` open
  above the grid, `<= 1e-4` open below it (None for an open end)."""
  if bracket is None or (bracket[0] is None and bracket[1] is None):
    return MISSING
  low, high = bracket
  if low is None:
    return f"<= {fmt_lr(high)}"
  return f"> {fmt_lr(low)}" if high is None else f"({fmt_lr(low)}, {fmt_lr(high)}]"


def absolute_table(a: th.Analysis) -> str:
  """Pass/fail of every known cell against L_best(d) + FAILURE_MARGIN, with
  that bound on the first row."""
  dims = _all_dims(a)
  bound = ["L_best + ln 1.2", ""] + [
      _loss(a.best[d] + th.FAILURE_MARGIN) if d in a.best else MISSING for d in dims]
  rows = [bound]
  for s in a.grid.scores:
    for lr in a.grid.learning_rates[s]:
      row = [s, fmt_lr(lr)]
      for d in dims:
        fail = a.fails.get(grids.Cell(s, d, lr))
        row.append(MISSING if fail is None else ("fail" if fail else "pass"))
      rows.append(row)
  return analysis_tables.markdown(["score", "lr"] + [f"d_k = {d}" for d in dims], rows)


def fmt_signed(x: float) -> str:
  """`x` to two decimals with its sign; a rounding of zero is +0.00, not -0.00."""
  return f"{round(x, 2) + 0.0:+.2f}"


def _range(pair: Sequence[float] | None) -> str:
  return MISSING if pair is None or pair[0] is None else f"[{fmt_signed(pair[0])}, {fmt_signed(pair[1])}]"


def _verdict(law: th.Law) -> str:
  """The verdict, with the bracket half-width that would decide an unresolved one."""
  if law.verdict is None:
    return MISSING
  if law.verdict == brackets.UNRESOLVED and law.band is None:
    return f"{law.verdict} (no band was registered, so no bracket can hold)"
  if law.verdict == brackets.UNRESOLVED and law.deciding_half_width is not None:
    return (f"{law.verdict} (a half-width of {law.deciding_half_width:.2f} about the "
            "interpolated slope would decide)")
  return law.verdict


def fmt_wide(wide: Sequence[tuple[int, float, float]]) -> str:
  """The cells that keep a bracket wide, `16: > 3.2e-2; 64: (1e-2, 3.2e-2]`
  (`<= x`: open below), or `none`."""
  if not wide:
    return "none"
  return "; ".join(f"{d}: " + fmt_bracket((lo if lo > 0 else None, None if hi == math.inf else hi))
                   for d, lo, hi in wide)


def law_table(a: th.Analysis) -> str:
  """The slope of log lr* on log d_k per score: its model-free bracket (every
  lr* anywhere in its grid interval) and half-width, the interpolated point
  estimate with its bootstrap interval over seeds (which leaves the grid's
  resolution out), the d_k fitted, the predicted slope, the pre-registered
  band where there is one, and the verdict (`threshold.verdict`)."""
  rows = []
  for law in a.laws.values():
    b = law.interval
    rows.append([law.score, _range(law.bracket),
                 MISSING if law.half_width is None else f"{law.half_width:.2f}",
                 MISSING if law.slope is None else fmt_signed(law.slope), _range((b.low, b.high)),
                 ", ".join(map(str, law.dims)) or MISSING,
                 f"{b.with_slope:,} of {b.replicates:,}",
                 MISSING if law.reference is None else f"{law.reference:+g}",
                 _range(law.band) if law.band else "none registered", _verdict(law),
                 fmt_wide(law.wide)])
  return analysis_tables.markdown(
      ["score", "slope bracket (grid intervals, no interpolation)", "half-width",
       "interpolated slope", "95% interval (bootstrap over seeds only)", "d_k fitted",
       "draws with a slope", "predicted", "band", "verdict",
       "d_k: lr* intervals wider than a quarter-decade"], rows)


def attention_table(a: th.Analysis) -> str:
  """lr_att per (score, d_k): its grid interval, with the flags that keep it
  out of the law."""
  rows = []
  for s in a.grid.scores:
    for d in a.grid.dims[s]:
      t = a.attention.get((s, d))
      if t is None:
        rows.append([s, str(d), MISSING, "no cell known"])
        continue
      cell = fmt_bracket(t.bracket)
      if t.below:
        flag = "below the grid: its lowest rate saturates"
      elif t.above:
        flag = "above the grid: no rate saturates"
      else:
        flag = "fitted"
      if not t.complete:
        flag = "provisional: lrs missing" if flag == "fitted" else f"{flag}; provisional"
      rows.append([s, str(d), cell, flag])
  return analysis_tables.markdown(["score", "d_k", "lr_att in (grid interval)", "flags"], rows)


def attention_law_table(a: th.Analysis) -> str:
  """The slope bracket of lr_att per score, the prediction, band and verdict."""
  rows = []
  for law in a.attention_laws.values():
    rows.append([law.score, _range(law.bracket),
                 MISSING if law.half_width is None else f"{law.half_width:.2f}",
                 ", ".join(map(str, law.dims)) or MISSING,
                 MISSING if law.reference is None else f"{law.reference:+g}",
                 _range(law.band) if law.band else "none registered", _verdict(law),
                 fmt_wide(law.wide)])
  return analysis_tables.markdown(
      ["score", "slope bracket (grid intervals)", "half-width", "d_k bracketed", "predicted",
       "band", "verdict", "d_k: lr_att intervals wider than a quarter-decade"], rows)


def sensitivity_table(a: th.Analysis) -> str:
  """Wortsman et al.'s sensitivity per (score, d_k), over each score's own
  learning rates (listed: the controls have three of the six)."""
  dims = _all_dims(a)
  rows = []
  for s in a.grid.scores:
    row = [s]
    for d in dims:
      v = a.sensitivity.get((s, d))
      t = a.thresholds.get((s, d))
      cell = MISSING if v is None else f"{v:.3f}"
      if v is not None and t is not None and not t.complete:
        cell += " (provisional)"
      row.append(cell)
    row.append(", ".join(fmt_lr(lr) for lr in a.grid.learning_rates[s]))
    rows.append(row)
  return analysis_tables.markdown(["score"] + [f"d_k = {d}" for d in dims] + ["learning rates"],
                                  rows)


def bleu_table(a: th.Analysis) -> str:
  """Test BLEU of every seed (seed 0 / seed 1 / ...), a row per (d_k, score), a
  column per learning rate of any score (`–`: not planned or not known)."""
  g = a.grid
  lrs = sorted({lr for s in g.scores for lr in g.learning_rates[s]})
  seeds = th.records_by_cell(g.records)
  rows = []
  for d in _all_dims(a):
    for s in g.scores:
      if d not in g.dims[s]:
        continue
      row = [str(d), s]
      for lr in lrs:
        known = seeds.get(grids.Cell(s, d, lr), [])
        row.append(" / ".join("diverged" if r.diverged else
                              MISSING if r.test_bleu is None else f"{r.test_bleu:.1f}"
                              for r in known) or MISSING)
      rows.append(row)
  return analysis_tables.markdown(["d_k", "score"] + [fmt_lr(lr) for lr in lrs], rows)


def _stat(stat: str, v: float | None) -> str:
  if v is None:
    return MISSING
  return f"{100 * v:.0f}%" if stat == "saturated" else f"{v:,.1f}"


def diagnostics_table(a: th.Analysis) -> str:
  """The largest self-attention logit and saturated share (largest over
  layers, mean over the seeds that logged it) per kind, at step 100 and at
  the last step."""
  columns = [(stat, kind, moment) for stat in grids.DIAGNOSTIC_STATS for moment in grids.MOMENTS
             for kind in grids.SELF_KINDS]
  names = {"max_logit": "max logit", "saturated": "saturated"}
  moments = {"step100": f"step {grids.EARLY_STEP}", "last": "last step"}
  header = ["score", "d_k", "lr"] + [
      f"{names[stat]} {kind.replace('_', ' ')}, {moments[m]}" for stat, kind, m in columns]
  rows = []
  for c in sorted(a.diagnostics):
    values = a.diagnostics[c]
    rows.append([c.score, str(c.dim), fmt_lr(c.lr)] + [
        _stat(stat, values.get(grids.diagnostic_key(stat, kind, m))) for stat, kind, m in columns])
  return analysis_tables.markdown(header, rows)


def clocks_table(a: th.Analysis) -> str:
  """The finished runs per score and their training clocks, summed."""
  clocks = records.run_clocks(a.grid.records)
  rows = [[s, str(clocks[s]["runs"]), f"{clocks[s]['hours']:.1f}"]
          for s in a.grid.scores if s in clocks]
  if clocks:
    rows.append(["all", str(sum(v["runs"] for v in clocks.values())),
                 f"{sum(v['hours'] for v in clocks.values()):.1f}"])
  return analysis_tables.markdown(["score", "finished runs", "training clock, hours"], rows)


def missing_table(a: th.Analysis) -> str:
  """The planned cells not yet known, a row per (score, d_k)."""
  by_pair: dict[tuple[str, int], list[float]] = {}
  for c in a.grid.missing:
    by_pair.setdefault((c.score, c.dim), []).append(c.lr)
  rows = [[s, str(d), ", ".join(fmt_lr(lr) for lr in sorted(lrs))]
          for (s, d), lrs in by_pair.items()]
  return analysis_tables.markdown(["score", "d_k", "learning rates not yet known"], rows)


def markdown(a: th.Analysis) -> str:
  """Every table of the analysis, each under its heading."""
  g = a.grid
  sections = [
      (f"L(s, d_k, lr): ln validation perplexity at step {g.steps}, mean over seeds",
       loss_table(a)),
      ("Test BLEU (each seed at its best validation BLEU checkpoint), seed by seed",
       bleu_table(a)),
      ("lr_opt and lr* (L reaches L(lr_opt) + ln 1.2): its grid interval, and "
       "log-lr interpolation inside it", threshold_table(a)),
      ("Slope of log lr* on log d_k", law_table(a)),
      (f"Attention rule beside it: lr_att, the lowest rate at which some self-attention "
       f"layer has more than {th.SATURATED_SHARE:.0%} of its rows over 0.99 on one key at "
       "the last step (mean over seeds; a diverged seed counts as saturated)",
       attention_table(a)),
      ("Slope of log lr_att on log d_k", attention_law_table(a)),
      ("Absolute criterion: L > L_best(d_k) + ln 1.2", absolute_table(a)),
      (f"Learning-rate sensitivity: mean of min(L, ln {g.vocab_size}) minus the best L",
       sensitivity_table(a)),
      ("Self-attention diagnostics (largest over layers, mean over seeds)",
       diagnostics_table(a)),
  ]
  if a.shared is not None:
    rates = ", ".join(fmt_lr(lr) for lr in th.shared_rates(g))
    where = f"on the learning rates every score ran ({rates}; beside the rule, not part of it)"
    sections += [(f"lr_opt and lr* {where}", threshold_table(a.shared)),
                 (f"Slope of log lr* on log d_k {where}", law_table(a.shared)),
                 (f"Learning-rate sensitivity {where}", sensitivity_table(a.shared))]
  sections.append(("Run clocks (each run's `train_seconds`; its seeds train as one program)",
                   clocks_table(a)))
  if g.missing:
    sections.append(("Cells not yet known", missing_table(a)))
  return "\n".join(f"## {title}\n\n{table}" for title, table in sections)
