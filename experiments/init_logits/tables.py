"""The init_logits measurement's fits, table and figure: logit scale against d_k.

Rows are one per (model, init, score, d_k, attention kind, layer)
(experiments/init_logits/run.py). Per d_k the statistics are pooled over the
attention modules (`pooled`), and a power law is fitted through them
(`fit`: `scaling.loglog_slope`, a log-log least-squares slope with its 95%
interval), so the footnote's claim, logit std ∝ √d_k, reads as a slope of
+0.5.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from attention_jax.analysis import scaling
from attention_jax.analysis import tables

MODELS = ("transformer", "rnn")
INITS = ("default", "premise")
KINDS = ("encoder_self", "decoder_self", "cross")
# The unscaled score of each model: the footnote's q·k.
UNSCALED = {"transformer": "dot", "rnn": "multiplicative"}
SCALED = {"transformer": "scaled_dot", "rnn": "scaled_multiplicative"}


def pooled(rows: list[dict], model: str, init: str, score: str, field: str,
           kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """`(dims, values)`: per d_k, the mean of `field` over the attention
  modules (of one `kind`, or of every kind) of one (model, init, score)."""
  by_dim: dict[int, list[float]] = {}
  for r in rows:
    if (r["model"], r["init"], r["score"]) == (model, init, score) and kind in (None, r["kind"]):
      by_dim.setdefault(r["dim"], []).append(r[field])
  dims = np.array(sorted(by_dim), dtype=np.float64)
  return dims, np.array([np.mean(by_dim[int(d)]) for d in dims])


def fit(rows: list[dict], model: str, init: str, score: str, field: str,
        kind: str | None = None) -> tuple[float, float, float] | None:
  """`scaling.loglog_slope` of the pooled `field` against d_k; None where
  fewer than 3 dims were measured or a value is not positive."""
  dims, values = pooled(rows, model, init, score, field, kind)
  if len(dims) < 3 or not np.all(values > 0):
    return None
  return scaling.loglog_slope(dims, values)


def _slope_text(result) -> str:
  if result is None:
    return "n/a"
  slope, lo, hi = result
  return f"{slope:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _groups(rows):
  """(model, init, score) in the order the rows were measured."""
  seen = []
  for r in rows:
    key = (r["model"], r["init"], r["score"])
    if key not in seen:
      seen.append(key)
  return seen


def summary(rows: list[dict]) -> list[dict[str, Any]]:
  """One entry per (model, init, score): the pooled slopes of logit std and
  max |logit| against d_k, the per-kind slopes of logit std, the pooled logit
  std at the smallest and largest d_k and at its peak (a single slope hides a
  rise-then-fall), and the saturated share at the largest d_k."""
  out = []
  for model, init, score in _groups(rows):
    dims, std = pooled(rows, model, init, score, "logit_std")
    _, sat = pooled(rows, model, init, score, "saturated")
    kinds = [k for k in KINDS if any(r["kind"] == k and r["model"] == model for r in rows)]
    out.append(dict(
        model=model, init=init, score=score, dims=[int(d) for d in dims],
        logit_std_slope=fit(rows, model, init, score, "logit_std"),
        max_abs_logit_slope=fit(rows, model, init, score, "max_abs_logit"),
        kind_slopes={k: fit(rows, model, init, score, "logit_std", k) for k in kinds},
        std_first=float(std[0]), std_last=float(std[-1]),
        std_peak=float(std.max()), dim_peak=int(dims[int(np.argmax(std))]),
        saturated_last=float(sat[-1])))
  return out


def _variance_cell(rows: list[dict]) -> str:
  """The mean query and key component variance of `rows`, each with its
  mean square in brackets where the two differ by more than 5%."""
  if not rows:
    return "n/a"
  cell = []
  for side in ("q", "k"):
    var = float(np.mean([r[f"{side}_var"] for r in rows]))
    square = float(np.mean([r[f"{side}_mean_square"] for r in rows]))
    text = f"{side} {var:.3g}"
    if abs(square - var) > 0.05 * var:
      text += f" ({square:.3g})"
    cell.append(text)
  return ", ".join(cell)


def _model_section(model: str, mine: list[dict[str, Any]], rows: list[dict]) -> str:
  """One model's part of `table.md`: its slopes, its per-kind slopes (where
  it has more than one attention kind) and its component variances."""
  dims = mine[0]["dims"]
  slopes = [[e["init"], e["score"], _slope_text(e["logit_std_slope"]),
             _slope_text(e["max_abs_logit_slope"]), f"{e['std_first']:.3g}",
             f"{e['std_peak']:.3g} ({e['dim_peak']})", f"{e['std_last']:.3g}",
             f"{100 * e['saturated_last']:.1f}%"] for e in mine]
  text = f"### {model}\n\n" + tables.markdown(
      ["init", "score", "slope of logit std", "slope of max \\|logit\\|",
       f"logit std at d={dims[0]}", "peak (at d)", f"logit std at d={dims[-1]}",
       f"saturated rows at d={dims[-1]}"], slopes)
  kinds = list(mine[0]["kind_slopes"])
  if len(kinds) > 1:
    per_kind = [[e["init"], e["score"], *(_slope_text(e["kind_slopes"][k]) for k in kinds)]
                for e in mine]
    text += ("\nSlope of logit std per attention kind (mean over layers):\n\n"
             + tables.markdown(["init", "score", *kinds], per_kind))
  variances = []
  for init in INITS:
    cells = [_variance_cell([r for r in rows if (r["model"], r["init"], r["dim"]) ==
                             (model, init, d)]) for d in dims]
    if any(c != "n/a" for c in cells):
      variances.append([init, *cells])
  return text + ("\nQuery / key component variance at step 0 (mean over scores, kinds and "
                 "layers; mean square in brackets where it differs by > 5%):\n\n"
                 + tables.markdown(["init", *(f"d={d}" for d in dims)], variances))


def table_markdown(rows: list[dict]) -> str:
  """`table.md`: the slopes per model / init / score, the per-kind slopes,
  and the measured query / key component variances per d_k."""
  entries = summary(rows)
  sections = [_model_section(model, [e for e in entries if e["model"] == model], rows)
              for model in MODELS if any(e["model"] == model for e in entries)]
  return ("Log-log least-squares slopes against d_k (95% interval, t with n - 2 dof). "
          "Pooled: per d_k the mean over attention kinds and layers, then the fit.\n"
          + "".join("\n" + section for section in sections))


def plot(rows: list[dict], path: str) -> None:
  """`logit_std.png`: log-log pooled logit std against d_k, one panel per
  model (rows) x init (columns), a line per score, and a dotted √d_k guide
  through the unscaled score's first point."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  models = [m for m in MODELS if any(r["model"] == m for r in rows)]
  inits = [i for i in INITS if any(r["init"] == i for r in rows)]
  fig, axes = plt.subplots(len(models), len(inits), figsize=(5.0 * len(inits),
                                                            3.8 * len(models)),
                           squeeze=False)
  for (row, model), (col, init) in itertools.product(enumerate(models), enumerate(inits)):
    ax = axes[row][col]
    scores = [s for m, i, s in _groups(rows) if (m, i) == (model, init)]
    for score in scores:
      dims, std = pooled(rows, model, init, score, "logit_std")
      ax.plot(dims, std, marker="o", label=score)
      if score == UNSCALED[model]:
        ax.plot(dims, std[0] * np.sqrt(dims / dims[0]), ":", color="grey",
                label="∝ √d_k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"{model}, {init} init")
    ax.grid(True, which="both", alpha=0.3)
    if row == len(models) - 1:
      ax.set_xlabel("d_k (per-head query/key size; RNN: a)")
    if col == 0:
      ax.set_ylabel("logit std over keys (step 0)")
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
