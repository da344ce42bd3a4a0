"""The figures of the learning-rate threshold analysis (`threshold.analyse`).

  curves      Wortsman et al.'s view: final validation loss and test BLEU
              against the learning rate (log x), a curve per d_k, a panel per
              score; a diverged cell is drawn at ln V (the uniform
              prediction's loss, as the sensitivity counts it) with an x
  heat maps   the largest self-attention logit over (lr, d_k) at step 100 and
              at the last step, a panel per score (log colour scale: logits
              from about 10 to tens of thousands)
  lr*         lr* against d_k on log-log axes, the fitted line per score and
              the reference slopes -1, -1/2 and 0
"""

from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.colors  # noqa: E402
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention_jax.analysis import plots  # noqa: E402
from experiments.lr_threshold import threshold as th  # noqa: E402
from experiments.lr_threshold import grids  # noqa: E402
from experiments.lr_threshold.tables import fmt_lr  # noqa: E402

CURVES = "lr_curves.png"
HEATMAPS = "max_logit_heatmaps.png"
LR_STAR = "lr_star.png"
REFERENCES = (-1.0, -0.5, 0.0)


def _panels(rows: int, columns: int, width: float = 4.2, height: float = 3.4):
  fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows),
                           squeeze=False, layout="constrained")
  return fig, axes


def _lr_axis(ax, lrs) -> None:
  ax.set_xscale("log")
  ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax.set_xticks(lrs, [fmt_lr(lr) for lr in lrs])
  ax.set_xlabel("peak learning rate")
  ax.grid(alpha=0.3)


def dim_colours(a: th.Analysis) -> dict[int, str]:
  """One colour per d_k, the same in every score's panel (a score may lack
  some d_k: the controls' panels must not recolour the rest)."""
  dims = sorted({d for s in a.grid.scores for d in a.grid.dims[s]})
  cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  return {d: cycle[i % len(cycle)] for i, d in enumerate(dims)}


def curves_figure(a: th.Analysis):
  """Final validation loss (top) and test BLEU (bottom) against the learning
  rate, a curve per d_k, a column per score. Each row shares its y axis and
  every panel spans every score's learning rates, so that panels compare by
  eye (the controls ran three of the six)."""
  g = a.grid
  ln_vocab = math.log(g.vocab_size)
  colours = dim_colours(a)
  all_lrs = sorted({lr for s in g.scores for lr in g.learning_rates[s]})
  fig, axes = _panels(2, len(g.scores))
  for row in axes:
    for ax in row[1:]:
      ax.sharey(row[0])
  for column, score in enumerate(g.scores):
    top, bottom = axes[0][column], axes[1][column]
    for dim in g.dims[score]:
      cells = [grids.Cell(score, dim, lr) for lr in g.learning_rates[score]
               if grids.Cell(score, dim, lr) in a.losses]
      if not cells:
        continue
      lrs = [c.lr for c in cells]
      losses = [a.losses[c] for c in cells]
      colour = colours[dim]
      top.plot(lrs, [min(v, ln_vocab) for v in losses], "o-", color=colour,
               label=f"d_k = {dim}")
      bad = [c.lr for c, v in zip(cells, losses) if not math.isfinite(v)]
      top.plot(bad, [ln_vocab] * len(bad), "x", color=colour, markersize=10)
      bleu = [(c.lr, a.test_bleu[c]) for c in cells if a.test_bleu[c] is not None]
      if bleu:
        bottom.plot(*zip(*bleu), "o-", color=colour, label=f"d_k = {dim}")
    top.axhline(ln_vocab, color="grey", linestyle=":", linewidth=1)
    top.set_title(score)
    top.set_ylabel(f"final validation loss (x: diverged, at ln {g.vocab_size})")
    bottom.set_ylabel("test BLEU (seeds not diverged)")
    for ax in (top, bottom):
      _lr_axis(ax, all_lrs)
      ax.set_xlim(all_lrs[0] / 1.5, all_lrs[-1] * 1.5)
    if top.get_legend_handles_labels()[0]:
      top.legend(fontsize=8)
  return fig


def plot_curves(a: th.Analysis, path: str) -> None:
  """`curves_figure` written to `path`."""
  plots.save_figure(curves_figure(a), path)


def heatmap_values(a: th.Analysis, score: str, moment: str) -> np.ndarray:
  """[d_k, lr] of the largest self-attention logit at `moment`, NaN where
  not known."""
  g = a.grid
  out = np.full((len(g.dims[score]), len(g.learning_rates[score])), np.nan)
  key = grids.diagnostic_key("max_logit", "self", moment)
  for i, dim in enumerate(g.dims[score]):
    for j, lr in enumerate(g.learning_rates[score]):
      v = a.diagnostics.get(grids.Cell(score, dim, lr), {}).get(key)
      if v is not None:
        out[i, j] = v
  return out


def cell_label(x: float) -> str:
  """A heat map cell's number: whole above 10, two significant digits below
  (`inverse_dim`'s logits start at 0.1-0.3, which a whole number shows as 0);
  "–" where not known (or not finite)."""
  if not np.isfinite(x):
    return "–"
  return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.2g}"


def plot_heatmaps(a: th.Analysis, path: str) -> None:
  """The largest self-attention logit over (lr, d_k), a row per moment
  (step 100, the last step), a column per score; one log colour scale."""
  g = a.grid
  values = {(s, m): heatmap_values(a, s, m) for s in g.scores for m in grids.MOMENTS}
  known = np.concatenate([v[np.isfinite(v)] for v in values.values()])
  positive = known[known > 0]
  norm = (matplotlib.colors.LogNorm(positive.min(), max(positive.max(), positive.min() * 10))
          if positive.size else None)
  fig, axes = _panels(len(grids.MOMENTS), len(g.scores), width=4.0, height=2.8)
  image = None
  for row, moment in enumerate(grids.MOMENTS):
    for column, score in enumerate(g.scores):
      ax, v = axes[row][column], values[(score, moment)]
      image = ax.imshow(np.where(v > 0, v, np.nan), norm=norm, cmap="viridis",
                        aspect="auto", origin="lower")
      for (i, j), x in np.ndenumerate(v):
        text = cell_label(x)
        ax.text(j, i, text, ha="center", va="center", fontsize=7,
                color="w" if np.isfinite(x) else "k")
      ax.set_xticks(range(len(g.learning_rates[score])),
                    [fmt_lr(lr) for lr in g.learning_rates[score]], fontsize=7)
      ax.set_yticks(range(len(g.dims[score])), [str(d) for d in g.dims[score]])
      if row == len(grids.MOMENTS) - 1:
        ax.set_xlabel("peak learning rate")
      if column == 0:
        ax.set_ylabel("d_k")
      when = f"step {grids.EARLY_STEP}" if moment == "step100" else f"step {g.steps}"
      ax.set_title(f"{score}, {when}", fontsize=9)
  if image is not None and norm is not None:
    fig.colorbar(image, ax=axes, label="largest self-attention logit (mean over seeds)",
                 shrink=0.8)
  plots.save_figure(fig, path)


def plot_lr_star(a: th.Analysis, path: str) -> None:
  """lr* against d_k (log-log): filled where it enters the fit, open where
  it is censored or provisional, each with a bar over its grid interval
  (the model-free bracket; the scores side by side so that equal bars stay
  apart); each score's fitted line, and the reference slopes drawn through
  the middle of the fitted points."""
  g = a.grid
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  fitted_all = []
  for i, score in enumerate(g.scores):
    colour = None
    beside = 2.0 ** (0.08 * (i - (len(g.scores) - 1) / 2))  # the score's place beside d_k
    for dim in g.dims[score]:
      t = a.thresholds.get((score, dim))
      if t is None or t.lr_star is None:
        continue
      style = dict(marker="o", markersize=8, linestyle="none")
      if not t.fitted:
        style.update(markerfacecolor="none")
      line, = ax.plot([dim * beside], [t.lr_star], color=colour, **style,
                      label=score if colour is None else None)
      colour = line.get_color()
      if t.bracket is not None and t.bracket[1] is not None:
        ax.plot([dim * beside] * 2, list(t.bracket), "-", color=colour, linewidth=3,
                alpha=0.35, solid_capstyle="butt")
      if t.fitted:
        fitted_all.append((dim, t.lr_star))
    law = a.laws[score]
    if law.slope is not None:
      xs = np.array([min(law.dims), max(law.dims)], np.float64)
      ys = [t for d, t in th.fit_points({d: a.thresholds[(score, d)] for d in law.dims})]
      anchor_x = math.exp(np.mean(np.log(law.dims)))
      anchor_y = math.exp(np.mean(np.log(ys)))
      ax.plot(xs, anchor_y * (xs / anchor_x) ** law.slope, "-", color=colour,
              label=f"{score} fit {law.slope:+.2f}")
  dims = sorted({d for s in g.scores for d in g.dims[s]})
  if fitted_all:
    cx = math.exp(np.mean(np.log([d for d, _ in fitted_all])))
    cy = math.exp(np.mean(np.log([lr for _, lr in fitted_all])))
  else:
    cx, cy = math.exp(np.mean(np.log(dims))), 1e-3
  xs = np.array([min(dims), max(dims)], np.float64)
  for ref, style in zip(REFERENCES, (":", "--", "-.")):
    ax.plot(xs, cy * (xs / cx) ** ref, style, color="grey", linewidth=1,
            label=f"slope {ref:+g}")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xticks(dims, [str(d) for d in dims])
  ax.set_xlabel("d_k")
  ax.set_ylabel("lr* (bars: its grid interval; open: censored or provisional)")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7)
  plots.save_figure(fig, path)


def plot_all(a: th.Analysis, folder: str) -> list[str]:
  """Every figure into `folder`; their file names."""
  for name, draw in ((CURVES, plot_curves), (HEATMAPS, plot_heatmaps), (LR_STAR, plot_lr_star)):
    draw(a, os.path.join(folder, name))
  return [CURVES, HEATMAPS, LR_STAR]
