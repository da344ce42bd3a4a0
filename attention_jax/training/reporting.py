"""Results of an ablation: the Britz-style table and the plots.

Every function here reads finished results (dicts as written to
`results.jsonl`) and writes files atomically; none of them trains anything.
"""

from __future__ import annotations

import collections
import io
import os
from typing import Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention_jax.training import checkpoints  # noqa: E402


def _fmt_params(n: int) -> str:
  return f"{n / 1e6:.3f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def britz_table(rows: Sequence[dict], arms: Sequence[str], dims: Sequence[int],
                metric: str = "test_bleu", best: Callable = max,
                params: bool = True) -> str:
  """Markdown table: a row per dim, a column per arm, `mean ± std (best)` over seeds.

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
  tail = " params |" if params else ""
  lines = ["| dim | " + " | ".join(arms) + " |" + tail,
           "|---|" + "---|" * len(arms) + ("---|" if params else "")]
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
    line = f"| {d} | " + " | ".join(row) + " |"
    if params:
      found = sorted({p for _, p in counts[d]})
      line += " " + (" / ".join(_fmt_params(p) for p in found) if found else "–") + " |"
    lines.append(line)
  return "\n".join(lines) + "\n"


def _fmt_p(p: float) -> str:
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def significance_table(tests: dict[tuple[str, int], dict], arms: Sequence[str],
                       dims: Sequence[int], baseline: str) -> str:
  """Markdown table of `Δ BLEU (p)` per dim and non-baseline arm, from
  `significance.compare_runs` results keyed by (arm, dim)."""
  others = [a for a in arms if a != baseline]
  lines = ["| dim | " + " | ".join(f"{a} − {baseline}" for a in others) + " |",
           "|---|" + "---|" * len(others)]
  for d in dims:
    row = []
    for a in others:
      t = tests.get((a, d))
      if t is None:
        row.append("–")
      elif t["delta"] is None:
        row.append("diverged")
      else:
        row.append(f"{t['delta']:+.2f} ({_fmt_p(t['p_max'])})")
    lines.append(f"| {d} | " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def save_figure(fig, path: str) -> None:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  plt.close(fig)
  checkpoints.atomic_write(path, buf.getvalue())


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
  axes[0].legend(fontsize=7)


def _plot_histories(histories, arms, path, panels) -> None:
  """Two panels of `_history_lines`; `panels` = ((key, ylabel, log y), ...)."""
  fig, axes = plt.subplots(1, len(panels), figsize=(11, 4))
  _history_lines(histories, arms, axes, [key for key, _, _ in panels])
  for ax, (_, label, log_y) in zip(axes, panels):
    ax.set_ylabel(label)
    if log_y:
      ax.set_yscale("log")
  save_figure(fig, path)


def plot_validation(histories: dict[tuple[str, int], list[dict]], arms: Sequence[str],
                    path: str) -> None:
  """Validation BLEU and perplexity over training, per arm (colour) and dim (style)."""
  _plot_histories(histories, arms, path,
                  (("val_bleu", "validation BLEU (in-training decoder)", False),
                   ("val_ppl", "validation perplexity", True)))


def plot_diagnostics(histories: dict[tuple[str, int], list[dict]], arms: Sequence[str],
                     path: str) -> None:
  """Logit std and normalised entropy over training, per arm (colour) and dim (style).

  `histories` maps (arm, dim) to metrics-log rows; seeds are averaged.
  """
  _plot_histories(histories, arms, path,
                  (("logit_std", "attention-logit std over valid keys", True),
                   ("entropy", "entropy / log(#valid keys)", False)))


def plot_attention(attention: dict, title: str, path: str) -> None:
  """Alignment heat map: hypothesis tokens (rows) by source tokens (columns)."""
  src, hyp = attention["src"], attention["hyp"]
  weights = np.asarray(attention["weights"])[:len(hyp), :len(src)]
  fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(src) + 2), max(3, 0.35 * len(hyp) + 1.5)))
  ax.imshow(weights, cmap="viridis", vmin=0, vmax=1, aspect="auto")
  ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
  ax.set_yticks(range(len(hyp)), hyp, fontsize=7)
  ax.set_xlabel("source")
  ax.set_ylabel("output")
  ax.set_title(title, fontsize=9)
  save_figure(fig, path)


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
  import json
  checkpoints.atomic_write(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
