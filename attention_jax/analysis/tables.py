"""The Markdown tables of results, the per-kind values they show, and the
one writer of every Markdown table in the codebase (`markdown`).

Every function here reads finished results (dicts as written to
`results.jsonl`) and returns text; none of them trains anything. The
figures of the same results are `plots`. Every Markdown table of the
reports, here and under `experiments/`, is written through `markdown`, so
that header, separator, alignment and cell spacing are decided in one
place (the measuring tools below `analysis`, which may not import it, keep
their profile table).
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Sequence

import numpy as np

# The separator cell of each column alignment: None (no mark: the
# renderer's default, left), "l" left, "r" right, "c" centred.
_RULES = {None: "---", "l": ":---", "r": "---:", "c": ":---:"}


def _line(cells: Sequence[str], blanks: int = 0) -> str:
  """One table line: each cell between pipes with a space either side (an
  empty string gives `|  |`), then `blanks` blank cells, `| |`."""
  return "|" + "|".join([f" {cell} " for cell in cells] + [" "] * blanks) + "|"


def _separator(align: Sequence[str | None], padded: bool) -> str:
  """The line between header and rows: `|---|---:|`, or with `padded`
  `| --- | ---: |`."""
  rules = [_RULES[a] for a in align]
  return "| " + " | ".join(rules) + " |" if padded else "|" + "".join(r + "|" for r in rules)


def _check(header: list[str], rows: list[list[str]], align: list[str | None]) -> None:
  """Refuses a table that would not render as written: no column, an
  alignment per column missing or unknown, a row wider than the header."""
  if not header:
    raise ValueError("a Markdown table needs at least one column.")
  if len(align) != len(header):
    raise ValueError(f"`align` has {len(align)} entries for {len(header)} columns.")
  unknown = [a for a in align if a not in _RULES]
  if unknown:
    raise ValueError(f"unknown alignment {unknown[0]!r}; use None, 'l', 'r' or 'c'.")
  wider = [row for row in rows if len(row) > len(header)]
  if wider:
    raise ValueError(f"a row of {len(wider[0])} cells in a table of {len(header)} columns: "
                     f"{wider[0]}")


def markdown(header: Sequence[object] | None, rows: Iterable[Sequence[object]],
             align: Sequence[str | None] | None = None, padded: bool = False,
             fill: bool = False) -> str:
  """A Markdown table: the header line, the separator and a line per row,
  each line ending in a newline.

  `header` holds the column titles and each row its cells, already
  formatted (each written as `str(cell)`, so an int needs no formatting).
  `align`: per column None (no mark, `---`), "l" (`:---`), "r" (`---:`) or
  "c" (`:---:`), or a string such as "lrr" where every column has a mark;
  None leaves every column unmarked. `padded` writes the separator with
  spaces, `| --- | ---: |`, as the calibration reports do; the others write
  `|---|---:|`. A row shorter than the header is written as it is, or with
  `fill` ends in blank cells, `| |` (an error row that has no values); one
  wider than the header is refused. A `header` of None writes the rows
  alone, to continue a table printed a row at a time.
  """
  rows = [[str(cell) for cell in row] for row in rows]
  if header is None:
    return "".join(_line(row) + "\n" for row in rows)
  header = [str(title) for title in header]
  align = [None] * len(header) if align is None else list(align)
  _check(header, rows, align)
  lines = [_line(header), _separator(align, padded)]
  lines += [_line(row, len(header) - len(row) if fill else 0) for row in rows]
  return "\n".join(lines) + "\n"


def _fmt_params(n: int) -> str:
  return f"{n / 1e6:.3f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def britz_table(rows: Sequence[dict], arms: Sequence[str], dims: Sequence,
                metric: str = "test_bleu", best: Callable = max,
                params: bool = True, row_label: str = "dim") -> str:
  """Markdown table: a row per dim, a column per arm, `mean ± std (best)` over seeds.

  A `--sweep` grid pivots with it too: rows keyed by the swept value in
  their `dim` entry, `dims` the swept values and `row_label` the axis.

  The std is the sample standard deviation (ddof=1) as in Britz et al.; with a
  single seed it is shown as 0. `best` picks the bracketed value (max for
  BLEU, min for perplexity). The params column lists each arm's count when
  they differ. Seeds whose run diverged (`diverged_at_step`) count in no mean
  and are marked in the cell.
  """
  cells = collections.defaultdict(list)
  diverged = collections.Counter()
  counts = collections.defaultdict(set)
  for r in rows:
    if r.get("diverged_at_step"):
      diverged[(r["arm"], r["dim"])] += 1
    elif r.get(metric) is not None:
      cells[(r["arm"], r["dim"])].append(r[metric])
    counts[r["dim"]].add((r["arm"], r["params"]))
  header = [row_label, *arms] + (["params"] if params else [])
  body = []
  for d in dims:
    row = []
    for a in arms:
      vals = np.asarray(cells.get((a, d), []), np.float64)
      n_div = diverged[(a, d)]
      mark = f"diverged ({n_div} of {n_div + vals.size} seeds)" if n_div else ""
      if vals.size == 0:
        row.append(mark or "–")
        continue
      std = vals.std(ddof=1) if vals.size > 1 else 0.0
      row.append(f"{vals.mean():.2f} ± {std:.2f} ({best(vals):.2f})"
                 + (f", {mark}" if mark else ""))
    if params:
      found = sorted({p for _, p in counts[d]})
      row.append(" / ".join(_fmt_params(p) for p in found) if found else "–")
    body.append([d, *row])
  return markdown(header, body)


def _fmt_p(p: float) -> str:
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def significance_table(tests: dict[tuple, dict], arms: Sequence[str],
                       dims: Sequence, baseline: str, row_label: str = "dim") -> str:
  """Markdown table of `Δ BLEU (p)` per dim (or swept value, `row_label`)
  and non-baseline arm, from `significance.compare_runs` results keyed by
  (arm, dim); a cell whose seed pairs differ in opposite directions lists
  the pairs' differences."""
  others = [a for a in arms if a != baseline]
  body = []
  for d in dims:
    row = []
    for a in others:
      t = tests.get((a, d))
      if t is None:
        row.append("–")
      elif t["delta"] is None:
        row.append("diverged")
      elif t.get("signs_agree", True):
        row.append(f"{t['delta']:+.2f} ({_fmt_p(t['p_max'])})")
      else:  # the mean hides pairs that differ in opposite directions
        pairs = ", ".join(f"{x:+.2f}" for x in t["deltas"])
        row.append(f"{t['delta']:+.2f} ({_fmt_p(t['p_max'])}; seed pairs disagree: {pairs})")
    body.append([d, *row])
  return markdown([row_label] + [f"{a} − {baseline}" for a in others], body)


# The Transformer's attention kinds, in the model's order (`transformer.
# ATTENTION_KINDS`; not imported, so that reports need no model code).
# `diagnostics.layer_metric` names their values `<stat>_<kind>_l<layer>`.
KINDS = ("encoder_self", "decoder_self", "cross")
# The per-kind statistics of the reports: (name, how the layers of a kind
# are summarised, label). The summary takes the layer furthest towards
# saturation (largest logit, largest saturated share, lowest entropy): a kind
# fails where one of its layers does (in `dot` the decoder's first self
# attention saturates before its second).
KIND_STATS = (
    ("max_logit", max, "largest attention logit"),
    ("saturated", max, "share of query rows whose largest weight > 0.99"),
    ("entropy", min, "entropy / log(#valid keys)"),
)
_SUMMARY = {stat: how for stat, how, _ in KIND_STATS}


def layer_values(diagnostics: dict, stat: str, kind: str) -> dict[int, float]:
  """`{layer: value}` of `stat` for the attention modules of `kind` in one
  diagnostics dict (a metrics-log row, or a result row's `diagnostics`);
  values logged as None (not finite) are left out."""
  prefix = f"{stat}_{kind}_l"
  return {int(k[len(prefix):]): float(v) for k, v in diagnostics.items()
          if k.startswith(prefix) and k[len(prefix):].isdigit() and v is not None}


def kind_value(diagnostics: dict, stat: str, kind: str) -> float | None:
  """`stat` of `kind` summarised over its layers (`KIND_STATS`); None if
  the dict has none (the RNN, or a value not finite in every layer)."""
  values = layer_values(diagnostics, stat, kind).values()
  return _SUMMARY[stat](values) if values else None


def has_kinds(rows: Iterable[dict]) -> bool:
  """Whether any row (a result row with `diagnostics`, or a metrics-log
  row) holds per-kind values: a Transformer's; the RNN's have none."""
  return any(layer_values(r.get("diagnostics") or r, stat, kind)
             for r in rows for stat, _, _ in KIND_STATS for kind in KINDS)


def one_layer_per_kind(rows: Iterable[dict]) -> bool:
  """Whether every attention kind in `rows` has values of one layer at most
  (the same layer in every row): a one-layer Transformer's, whose tables
  per kind and layer would repeat its tables per kind cell for cell."""
  layers = collections.defaultdict(set)
  for r in rows:
    diagnostics = r.get("diagnostics") or r
    for stat, _, _ in KIND_STATS:
      for kind in KINDS:
        layers[kind] |= set(layer_values(diagnostics, stat, kind))
  return all(len(found) <= 1 for found in layers.values())


def with_kind_values(row: dict) -> dict:
  """`row` with `<stat>_<kind>` (`kind_value`) for every per-kind statistic
  of its diagnostics (its own fields for a metrics-log row), for the plots."""
  diagnostics = row.get("diagnostics") or row
  extra = {f"{stat}_{kind}": kind_value(diagnostics, stat, kind)
           for stat, _, _ in KIND_STATS for kind in KINDS}
  return {**row, **{k: v for k, v in extra.items() if v is not None}}


def _fmt_stat(stat: str, x: float) -> str:
  if stat == "saturated":
    return f"{100 * x:.0f}%"
  if stat == "entropy":
    return f"{x:.3f}"
  return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.1f}"  # logits: 14.5 to 25,184


def kind_table(rows: Sequence[dict], arms: Sequence[str], values: Sequence, stat: str,
               row_label: str = "dim", per_layer: bool = False) -> str:
  """Markdown table of the end-of-training `stat` (a `KIND_STATS` name) of
  every attention kind: a row per arm and row value (`r["dim"]`, as in
  `britz_table`), a column per kind summarised over its layers
  (`kind_value`), or with `per_layer` a column per kind and layer; each cell
  the mean over seeds of the rows' `diagnostics`. Seeds whose run diverged
  count in no mean and are named in the row; (arm, value) pairs without
  rows are left out."""
  kept, diverged = collections.defaultdict(list), collections.Counter()
  for r in rows:
    key = (r["arm"], r["dim"])
    if r.get("diverged_at_step"):
      diverged[key] += 1
    else:
      kept[key].append(r.get("diagnostics") or {})
  every = [d for group in kept.values() for d in group]
  if per_layer:
    columns = sorted({(kind, layer) for d in every for kind in KINDS
                      for layer in layer_values(d, stat, kind)},
                     key=lambda c: (KINDS.index(c[0]), c[1]))
    names = [f"{kind} l{layer}" for kind, layer in columns]
    value_of = lambda d, c: layer_values(d, stat, c[0]).get(c[1])
  else:
    columns = [k for k in KINDS if any(layer_values(d, stat, k) for d in every)]
    names = list(columns)
    value_of = lambda d, c: kind_value(d, stat, c)
  body = []
  for arm in arms:
    for v in values:
      key = (arm, v)
      group, n_div = kept.get(key, []), diverged[key]
      if not group and not n_div:
        continue
      cells = []
      for c in columns:
        found = [x for x in (value_of(d, c) for d in group) if x is not None]
        cells.append(_fmt_stat(stat, float(np.mean(found))) if found else "–")
      label = arm + (f" ({n_div} of {n_div + len(group)} seeds diverged)" if n_div else "")
      body.append([label, v, *cells])
  return markdown(["arm", row_label, *names], body)
