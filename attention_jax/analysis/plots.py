"""The figures of results: the ablation, a grid's sweeps, histories, alignments.

Every function here reads finished results (dicts as written to
`results.jsonl`, or `metrics.jsonl` histories) and writes a PNG atomically
(`save_figure`); none of them trains anything. The tables of the same
results are `tables`.
"""

from __future__ import annotations

import collections
import io
import math
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention_jax.analysis import tables  # noqa: E402
from attention_jax import files  # noqa: E402
from attention_jax.training.run_config import MEMBER_FIELDS  # noqa: E402


def save_figure(fig, path: str) -> None:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  plt.close(fig)
  files.atomic_write(path, buf.getvalue())


def plot_ablation(rows: Sequence[dict], arms: Sequence[str], path: str) -> None:
  """Test BLEU and validation perplexity vs attention dimension, one line per
  arm, error bars = std over seeds."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for ax, metric, label in ((axes[0], "test_bleu", "test BLEU"),
                            (axes[1], "val_ppl", "validation perplexity")):
    for arm in arms:
      by_dim = collections.defaultdict(list)
      for r in rows:
        if r["arm"] == arm and r.get(metric) is not None:
          by_dim[r["dim"]].append(r[metric])
      if not by_dim:
        continue
      dims = sorted(by_dim)
      mean = [np.mean(by_dim[d]) for d in dims]
      std = [np.std(by_dim[d], ddof=1) if len(by_dim[d]) > 1 else 0.0 for d in dims]
      ax.errorbar(dims, mean, yerr=std, marker="o", capsize=4, label=arm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("attention dimension a")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  axes[1].set_yscale("log")
  axes[0].legend()
  save_figure(fig, path)


def log_axis(axis: str, values: Sequence) -> bool:
  """Whether a swept axis is drawn on a log scale: the learning rate always,
  any other positive numeric axis spanning a factor of 10 or more."""
  if axis == "learning_rate":
    return True
  numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
  return (len(numbers) == len(values) > 1 and min(numbers) > 0
          and max(numbers) / min(numbers) >= 10)


def _sweep_lines(ax, rows: Sequence[dict], arms: Sequence[str], axis: str,
                 metric: str) -> None:
  """On `ax`: `metric` against the swept `axis`, one line per (arm, dim)
  (colour = arm, style = dim), error bars = std over seeds; rows of further
  axes are pooled per value of `axis`."""
  colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
  dims = sorted({r["dim"] for r in rows})
  styles = dict(zip(dims, ["o-", "s--", "^:", "d-."] * 4))
  for arm in arms:
    for dim in dims:
      by_value = collections.defaultdict(list)
      for r in rows:
        if r["arm"] == arm and r["dim"] == dim and r.get(metric) is not None:
          by_value[r[axis]].append(r[metric])
      if not by_value:
        continue
      xs = sorted(by_value)
      ax.errorbar(xs, [np.mean(by_value[x]) for x in xs],
                  yerr=[np.std(by_value[x], ddof=1) if len(by_value[x]) > 1 else 0.0
                        for x in xs],
                  fmt=styles[dim], capsize=4, color=colours.get(arm), label=f"{arm} a={dim}")


def _sweep_axis(ax, axis: str, values: Sequence, label: str) -> None:
  """The x axis of a swept `axis` (log where `log_axis`, ticks at the swept
  values only) and the y label."""
  if log_axis(axis, values):
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  if all(isinstance(v, (int, float)) for v in values):
    ax.set_xticks(values, [f"{v:g}" for v in values])  # the swept values, nothing else
  ax.set_xlabel(axis)
  ax.set_ylabel(label)
  ax.grid(alpha=0.3)


def plot_sweep(rows: Sequence[dict], arms: Sequence[str], axis: str, path: str) -> None:
  """Test BLEU and validation perplexity against the swept `axis`, one line
  per (arm, dim) (colour = arm, style = dim), error bars = std over seeds;
  rows of further axes are pooled per value of `axis`."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  values = sorted({r[axis] for r in rows})
  for ax, metric, label in ((axes[0], "test_bleu", "test BLEU"),
                            (axes[1], "val_ppl", "validation perplexity")):
    _sweep_lines(ax, rows, arms, axis, metric)
    _sweep_axis(ax, axis, values, label)
  axes[1].set_yscale("log")
  axes[0].legend(fontsize=7)
  save_figure(fig, path)


def _kind_scale(ax, stat: str, lowest: float | None = None) -> None:
  """The y axis of a per-kind panel: a logit on a symmetric log scale (from
  about 1 to tens of thousands, possibly negative) whose bottom is the
  `lowest` value drawn or 0 (an error bar of a large spread would
  otherwise stretch it to large negative values), shares in [0, 1]."""
  if stat == "max_logit":
    ax.set_yscale("symlog", linthresh=1.0)
    if lowest is not None:
      ax.set_ylim(bottom=min(0.0, lowest))
  else:
    ax.set_ylim(-0.03, 1.03)


def plot_kinds_sweep(rows: Sequence[dict], arms: Sequence[str], axis: str, path: str) -> None:
  """The end-of-training per-kind statistics of a Transformer grid against
  its swept `axis`: a row of panels per `tables.KIND_STATS` entry, a column per
  kind (its layers summarised, `tables.kind_value`), lines as `plot_sweep`'s."""
  rows = [tables.with_kind_values(r) for r in rows if not r.get("diverged_at_step")]
  values = sorted({r[axis] for r in rows})
  fig, axes = plt.subplots(len(tables.KIND_STATS), len(tables.KINDS),
                           figsize=(5 * len(tables.KINDS), 3.6 * len(tables.KIND_STATS)),
                           squeeze=False)
  for i, (stat, _, label) in enumerate(tables.KIND_STATS):
    for j, kind in enumerate(tables.KINDS):
      ax = axes[i][j]
      key = f"{stat}_{kind}"
      _sweep_lines(ax, rows, arms, axis, key)
      _sweep_axis(ax, axis, values, label if j == 0 else "")
      _kind_scale(ax, stat, min((r[key] for r in rows if key in r), default=None))
      if i == 0:
        ax.set_title(kind.replace("_", " "), fontsize=10)
  axes[0][0].legend(fontsize=7)
  save_figure(fig, path)


def plot_history_panels(histories: dict[str, dict], arms: Sequence[str],
                        panels: Sequence[tuple], path: str, note: str | None = None) -> None:
  """A column per grid point (`histories[point][(arm, dim)]` = metrics-log
  rows) and a row per `(key, label)` or `(key, label, scale)` of `panels`,
  each key over training; each row shares its y axis, on a symmetric log
  scale unless `scale` says otherwise (a maximum logit can be negative).
  `note`, above the panels, says what each line averages."""
  names = list(histories)
  fig, axes = plt.subplots(len(panels), len(names),
                           figsize=(4.5 * len(names), 4 * len(panels)), sharey="row",
                           squeeze=False)
  for i, (row, (key, label, *scale)) in enumerate(zip(axes, panels)):
    for ax, name in zip(row, names):
      _history_lines(histories[name], arms, [ax], [key])
      if (scale or ["symlog"])[0] == "symlog":
        ax.set_yscale("symlog", linthresh=1.0)
      else:
        ax.set_yscale(scale[0])
      if i == 0:
        ax.set_title(name, fontsize=9)
      elif ax.get_legend() is not None:
        ax.get_legend().remove()  # several rows: the first row's legends only
    row[0].set_ylabel(label)
  if note:
    fig.suptitle(note, fontsize=9)
  save_figure(fig, path)


def plot_kinds_history(histories: dict[tuple[str, int], list[dict]], arms: Sequence[str],
                       path: str) -> None:
  """The Transformer's per-kind statistics over training: a row of panels
  per `tables.KIND_STATS` entry, a column per kind (its layers summarised,
  `tables.kind_value`), one line per (arm, dim), seeds averaged."""
  histories = {k: [tables.with_kind_values(r) for r in rows] for k, rows in histories.items()}
  fig, axes = plt.subplots(len(tables.KIND_STATS), len(tables.KINDS), squeeze=False,
                           figsize=(5 * len(tables.KINDS), 3.6 * len(tables.KIND_STATS)))
  for i, (stat, _, label) in enumerate(tables.KIND_STATS):
    _history_lines(histories, arms, axes[i], [f"{stat}_{kind}" for kind in tables.KINDS])
    for j, (ax, kind) in enumerate(zip(axes[i], tables.KINDS)):
      _kind_scale(ax, stat)
      if j == 0:
        ax.set_ylabel(label)
      if i == 0:
        ax.set_title(kind.replace("_", " "), fontsize=10)
      elif j == 0 and ax.get_legend() is not None:
        ax.get_legend().remove()  # one legend, in the first panel
  save_figure(fig, path)


def _history_lines(histories, arms, axes, keys):
  """One line per (arm, dim) and key of `histories` (metrics-log rows), seeds
  averaged; colour = arm, style = dim. A history keyed by a plain label
  (not an (arm, dim) pair) is drawn solid under that label."""
  colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
  pairs = {k: (k if isinstance(k, tuple) else (k, None)) for k in histories}
  dims = sorted({d for _, d in pairs.values() if d is not None})
  styles = {None: "-", **dict(zip(dims, ["-", "--", ":", "-."] * 4))}
  for key, rows in histories.items():
    arm, dim = pairs[key]
    for ax, key in zip(axes, keys):
      by_step = collections.defaultdict(list)
      for r in rows:
        if r.get(key) is not None:
          by_step[r["step"]].append(r[key])
      if not by_step:
        continue
      steps = sorted(by_step)
      ax.plot(steps, [np.mean(by_step[s]) for s in steps], styles[dim],
              color=colours.get(arm), label=arm if dim is None else f"{arm} a={dim}")
  for ax in axes:
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  if axes[0].get_lines():  # a key no line has (a log without validations) draws nothing
    axes[0].legend(fontsize=7)


def _plot_histories(histories, arms, path, panels, note: str | None = None) -> None:
  """Panels of `_history_lines`; `panels` = ((key, ylabel, log y: True,
  False or 'symlog'), ...); `note` above them says what each line averages."""
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
  if note:
    fig.suptitle(note, fontsize=9)
  _history_lines(histories, arms, axes, [key for key, _, _ in panels])
  for ax, (_, label, log_y) in zip(axes, panels):
    ax.set_ylabel(label)
    if log_y == "symlog":  # may be negative
      ax.set_yscale("symlog", linthresh=1.0)
    elif log_y:
      ax.set_yscale("log")
  save_figure(fig, path)


def plot_validation(histories: dict[tuple[str, int], list[dict]], arms: Sequence[str],
                    path: str, note: str | None = None) -> None:
  """Validation BLEU and perplexity over training, per arm (colour) and dim
  (style), or per label; `note` says what each line averages."""
  _plot_histories(histories, arms, path,
                  (("val_bleu", "validation BLEU (in-training decoder)", False),
                   ("val_ppl", "validation perplexity", True)), note)


def member_values(row: dict) -> tuple[tuple[str, float], ...]:
  """The member values (`--members`: `run_config.MEMBER_FIELDS`) a result
  row or metrics-log line carries; () for a run of seeds only."""
  return tuple((field, row[field]) for field in MEMBER_FIELDS if field in row)


def member_curves(histories: dict[str, list[dict]],
                  member: dict[str, float] | None = None) -> dict[str, list[dict]]:
  """`{label: metrics-log rows}` with each run of several member values
  (`--members`) split into a history per value, labelled 'LABEL
  learning_rate=0.001': averaging them made one curve of several learning
  rates. `member` keeps only the rows of those values (a float matches to
  rounding); a run of seeds only is kept whole."""
  out = {}
  for label, rows in histories.items():
    if member:
      rows = [r for r in rows if all(
          isinstance(r.get(k), (int, float)) and math.isclose(r[k], v, rel_tol=1e-9)
          for k, v in member.items())]
    groups = {}
    for r in rows:
      groups.setdefault(member_values(r), []).append(r)
    for values, group in groups.items():
      name = ", ".join(f"{k}={v:g}" for k, v in values)
      out[f"{label} {name}" if name else label] = group
  return out


def seeds_note(histories: dict) -> str:
  """What each curve of `histories` averages: 'mean over seeds 0, 1'
  ('seed 0' where there is one)."""
  seeds = sorted({r["seed"] for rows in histories.values() for r in rows if "seed" in r})
  if len(seeds) == 1:
    return f"seed {seeds[0]} (one seed)"
  return f"mean over seeds {', '.join(map(str, seeds))}"


def plot_diagnostics(histories: dict[tuple[str, int], list[dict]], arms: Sequence[str],
                     path: str) -> None:
  """Logit std, normalised entropy and the largest logit over training, per
  arm (colour) and dim (style).

  `histories` maps (arm, dim) to metrics-log rows; seeds are averaged.
  """
  _plot_histories(histories, arms, path,
                  (("logit_std", "attention-logit std over valid keys", True),
                   ("entropy", "entropy / log(#valid keys)", False),
                   ("max_logit", "largest attention logit", "symlog")))


# Drawn in place of the heat map when the decoded hypothesis has no token.
EMPTY_HYPOTHESIS_NOTE = ("no heat map: the decoded output of this\nsentence is empty, so "
                         "there is no row\nof attention weights to draw (early in\n"
                         "training a model can end a sentence at once)")


def plot_attention(attention: dict, title: str, path: str) -> None:
  """Alignment heat map: hypothesis tokens (rows) by source tokens (columns).
  An empty hypothesis (a first run's model can decode one) has no row: the
  source axis is drawn with a note saying why, instead of a blank image and
  matplotlib's warning about a singular y range."""
  src, hyp = attention["src"], attention["hyp"]
  fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(src) + 2), max(3, 0.35 * len(hyp) + 1.5)))
  if not hyp:
    ax.set_xlim(-0.5, max(len(src), 1) - 0.5)
    ax.set_ylim(0, 1)
    ax.text(0.5, 0.5, EMPTY_HYPOTHESIS_NOTE, transform=ax.transAxes, ha="center",
            va="center", fontsize=8)
    ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("source")
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)
    return
  weights = np.asarray(attention["weights"])[:len(hyp), :len(src)]
  ax.imshow(weights, cmap="viridis", vmin=0, vmax=1, aspect="auto")
  ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
  ax.set_yticks(range(len(hyp)), hyp, fontsize=7)
  ax.set_xlabel("source")
  ax.set_ylabel("output")
  ax.set_title(title, fontsize=9)
  save_figure(fig, path)
