"""Results of an ablation: the Britz-style table and the plots.

Every function here reads finished results (dicts as written to
`results.jsonl`) and writes files atomically; none of them trains anything.
"""

from __future__ import annotations

import collections
import io
import os
from typing import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention_jax.training import checkpoints  # noqa: E402


def _fmt_params(n: int) -> str:
  return f"{n / 1e6:.3f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def britz_table(rows: Sequence[dict], arms: Sequence[str], dims: Sequence[int],
                metric: str = "test_bleu") -> str:
  """Markdown table: a row per dim, a column per arm, `mean ± std (max)` over seeds.

  The std is the sample standard deviation (ddof=1) as in Britz et al.; with a
  single seed it is shown as 0. The params column lists each arm's count when
  they differ.
  """
  cells = collections.defaultdict(list)
  params = collections.defaultdict(set)
  for r in rows:
    cells[(r["arm"], r["dim"])].append(r[metric])
    params[r["dim"]].add((r["arm"], r["params"]))
  lines = ["| dim | " + " | ".join(arms) + " | params |",
           "|---|" + "---|" * len(arms) + "---|"]
  for d in dims:
    row = []
    for a in arms:
      vals = np.asarray(cells.get((a, d), []), np.float64)
      if vals.size == 0:
        row.append("–")
        continue
      std = vals.std(ddof=1) if vals.size > 1 else 0.0
      row.append(f"{vals.mean():.2f} ± {std:.2f} ({vals.max():.2f})")
    counts = sorted({p for _, p in params[d]})
    pcol = " / ".join(_fmt_params(p) for p in counts) if counts else "–"
    lines.append(f"| {d} | " + " | ".join(row) + f" | {pcol} |")
  return "\n".join(lines) + "\n"


def _save(fig, path: str) -> None:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  plt.close(fig)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(buf.getvalue())
  os.replace(tmp, path)


def plot_ablation(rows: Sequence[dict], arms: Sequence[str], path: str,
                  metric: str = "test_bleu") -> None:
  """Test BLEU vs attention dimension, one line per arm, error bars = std over seeds."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for arm in arms:
    by_dim = collections.defaultdict(list)
    for r in rows:
      if r["arm"] == arm:
        by_dim[r["dim"]].append(r[metric])
    if not by_dim:
      continue
    dims = sorted(by_dim)
    mean = [np.mean(by_dim[d]) for d in dims]
    std = [np.std(by_dim[d], ddof=1) if len(by_dim[d]) > 1 else 0.0 for d in dims]
    ax.errorbar(dims, mean, yerr=std, marker="o", capsize=4, label=arm)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("attention dimension a")
  ax.set_ylabel(metric.replace("_", " ").replace("bleu", "BLEU"))
  ax.grid(alpha=0.3)
  ax.legend()
  _save(fig, path)


def plot_diagnostics(histories: dict[tuple[str, int], list[dict]], arms: Sequence[str],
                     path: str) -> None:
  """Logit std and normalised entropy over training, per arm (colour) and dim (style).

  `histories` maps (arm, dim) to metrics-log rows; seeds are averaged.
  """
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
  dims = sorted({d for _, d in histories})
  styles = dict(zip(dims, ["-", "--", ":", "-."] * 4))
  for (arm, dim), rows in sorted(histories.items()):
    for ax, key in zip(axes, ("logit_std", "entropy")):
      by_step = collections.defaultdict(list)
      for r in rows:
        if r.get(key) is not None:
          by_step[r["step"]].append(r[key])
      if not by_step:
        continue
      steps = sorted(by_step)
      ax.plot(steps, [np.mean(by_step[s]) for s in steps], styles[dim],
              color=colours.get(arm), label=f"{arm} a={dim}")
  axes[0].set_yscale("log")
  axes[0].set_ylabel("attention-logit std over valid keys")
  axes[1].set_ylabel("entropy / log(#valid keys)")
  for ax in axes:
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=7)
  _save(fig, path)


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
  _save(fig, path)


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
  import json
  checkpoints.atomic_write(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
