"""`benchmark.md` (one table per suite) and the log-log plots, from the rows.

Pure functions of the rows (as written to `benchmark.jsonl`), except `plot`,
which writes its PNGs atomically into the workdir.

Glossary: B batch, H heads, T sequence length (Tq = Tk), D head size, a
additive attention size.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Iterator

import numpy as np

from attention_jax.analysis import plots
from attention_jax.analysis import tables


def fmt_time(s: float | None) -> str:
  if s is None:
    return "—"
  if s < 1e-3:
    return f"{s * 1e6:.0f} µs"
  return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def fmt_bytes(n: int | None) -> str:
  return "—" if n is None else f"{n / 2 ** 20:.1f} MiB"


def _fmt(value: float | None, spec: str) -> str:
  return "—" if value is None else format(value, spec)


def markdown_tables(rows: list[dict], machine: dict[str, Any], command: str) -> str:
  """`benchmark.md`: the command and the machine, then one table per suite."""
  lines = [f"Command: `python -m experiments.kernels.run {command}`", "",
           f"Machine: {machine['cpu']} ({machine['cpu_cores']} cores), JAX "
           f"{machine['jax_version']} on {machine['platform']} ({machine['device_kind']})."]
  loads = [r["loadavg_1m"] for r in rows if r.get("loadavg_1m") is not None]
  if loads:
    lines.append(f"1-minute load average during the run: {min(loads):.1f}-{max(loads):.1f} "
                 f"(this benchmark alone accounts for up to its thread count; more means "
                 f"other processes shared the machine).")
  other = [r["other_load_cores"] for r in rows if r.get("other_load_cores") is not None]
  if other:
    lines.append(f"Cores kept busy by other processes while timing: {min(other):.2f}-"
                 f"{max(other):.2f} (column 'other load'; rows with high values are "
                 f"slowed by contention).")
  lines.append("")
  for suite, table in (("kernels", _kernel_table), ("additive", _additive_table),
                       ("models", _model_table)):
    suite_rows = [r for r in rows if r["suite"] == suite]
    if suite_rows:
      lines += table(suite_rows)
  return "\n".join(lines) + "\n"


def _kernel_table(kernels: list[dict]) -> list[str]:
  """The kernels suite's table (one entry) and the time ratios under it, as report lines."""
  # The profiler's device times, where any row has them (`--device_timing`).
  device = any("device_time_median_s" in r for r in kernels)
  rows = []
  for r in kernels:
    status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')[:60]}"
    extra = ([fmt_time(r.get("device_time_median_s")), _fmt(r.get("device_tflops"), ".3f")]
             if device else [])
    rows.append([r["impl"], r["mode"], r["dtype"], r["batch"], r["heads"], r["seq_len"],
                 r["head_dim"], r["causal"], fmt_time(r.get("time_median_s")),
                 fmt_time(r.get("time_iqr_s")), _fmt(r.get("tflops"), ".3f"), *extra,
                 _fmt(r.get("pct_peak"), ".1f"), fmt_bytes(r.get("temp_bytes")),
                 _fmt(r.get("other_load_cores"), ".2f"), status])
  header = ["impl", "mode", "dtype", "B", "H", "T", "D", "causal", "median",
            "spread (IQR)", "TFLOP/s"]
  header += ["device median (profiler)", "device TFLOP/s"] if device else []
  table = tables.markdown(header + ["% peak", "temp memory", "other load", "status"], rows)
  return [table.rstrip("\n"), ""] + ratio_lines(kernels) + [""]


def ratio_lines(kernels: list[dict]) -> list[str]:
  """Time ratios of the library's scaled_dot to jax_xla and torch, per matching case."""
  out = []
  key = lambda r: (r["mode"], r["dtype"], r["batch"], r["heads"], r["seq_len"], r["head_dim"],
                   r["causal"])
  by_case = {}
  for r in kernels:
    if r["status"] == "ok":
      by_case.setdefault(key(r), {})[r["impl"]] = r["time_median_s"]
  for case, times in sorted(by_case.items()):
    if "scaled_dot" not in times:
      continue
    parts = [f"{other} / scaled_dot = {times[other] / times['scaled_dot']:.2f}"
             for other in ("jax_xla", "torch", "scaled_dot_plain", "naive") if other in times]
    if parts:
      out.append(f"- {case[0]} {case[1]} B={case[2]} H={case[3]} T={case[4]} D={case[5]} "
                 f"causal={case[6]}: " + ", ".join(parts) + " (time ratios; > 1: library faster)")
  return out


def _additive_table(additive: list[dict]) -> list[str]:
  """The additive suite's table (one entry) and the chunked / naive ratios under it."""
  rows = []
  for r in additive:
    per = r.get("temp_bytes")
    per = "—" if per is None else f"{per / (r['batch'] * r['seq_len'] ** 2):.0f} B"
    rows.append([r["impl"], r["batch"], r["seq_len"], r["attention_dim"],
                 fmt_time(r.get("time_median_s")), fmt_bytes(r.get("temp_bytes")), per,
                 r["status"]])
  table = tables.markdown(["additive", "B", "T", "a", "median", "temp memory", "temp / (B·T²)",
                           "status"], rows)
  return [table.rstrip("\n"), ""] + additive_lines(additive) + [""]


def additive_lines(additive: list[dict]) -> list[str]:
  """Chunked / naive ratios of temp memory (and time, where both were timed) per T."""
  out = []
  by_t = {}
  for r in additive:
    by_t.setdefault(r["seq_len"], {})[r["impl"]] = r
  for t, pair in sorted(by_t.items()):
    c, n = pair.get("additive_chunked"), pair.get("additive_naive")
    if not c or not n or not c.get("temp_bytes") or not n.get("temp_bytes"):
      continue
    text = f"- T={t}: chunked temp memory = {c['temp_bytes'] / n['temp_bytes']:.3f} × naive"
    if c.get("time_median_s") and n.get("time_median_s"):
      text += f", time = {c['time_median_s'] / n['time_median_s']:.2f} × naive"
    out.append(text)
  return out


def _model_table(model_rows: list[dict]) -> list[str]:
  """The models suite's table (one entry), with each run's speed-up over one seed."""
  one = {r["model"]: r.get("tokens_per_s") for r in model_rows if r.get("seeds") == 1}
  rows = []
  for r in model_rows:
    tps = r.get("tokens_per_s")
    ratio = "—" if not tps or not one.get(r["model"]) else f"{tps / one[r['model']]:.2f}"
    rows.append([r["model"], r["size"], f"{r.get('params', 0):,}", r["batch"], r["seq_len"],
                 r["impl"], _fmt(tps, ",.0f"), ratio, fmt_time(r.get("time_median_s")),
                 r["status"]])
  table = tables.markdown(["model", "size", "params (one)", "B", "T", "run",
                           "training tokens/s", "× one seed", "median per call", "status"], rows)
  return [table.rstrip("\n")]


def _log_axes(ax, xlabel: str, ylabel: str) -> None:
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(True, which="both", alpha=0.3)


def plot(rows: list[dict], workdir: str) -> list[str]:
  """Log-log plots of this run's rows into `workdir`; returns the file names written."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  written = []
  # One figure at a time: each is closed once saved.
  for name, fig in itertools.chain(_kernel_figures(rows, plt), _additive_figures(rows, plt)):
    plots.save_figure(fig, os.path.join(workdir, name))
    written.append(name)
  return written


def _kernel_figures(rows: list[dict], plt) -> Iterator[tuple[str, Any]]:
  """Time and memory vs T per implementation, one figure per (mode, dtype, D, causal, B, H)."""
  groups = {}
  for r in rows:
    if r["suite"] == "kernels" and r["status"] == "ok":
      groups.setdefault((r["mode"], r["dtype"], r["head_dim"], r["causal"], r["batch"],
                         r["heads"]), []).append(r)
  for (mode, dtype, d, causal, b, h), group in sorted(groups.items()):
    if len({r["seq_len"] for r in group}) < 2:
      continue
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl in sorted({r["impl"] for r in group}):
      pts = sorted((r["seq_len"], r) for r in group if r["impl"] == impl)
      xs = [p[0] for p in pts]
      med = np.array([p[1]["time_median_s"] for p in pts]) * 1e3  # ms
      lo = med - np.array([p[1]["time_min_s"] for p in pts]) * 1e3
      hi = np.array([p[1]["time_max_s"] for p in pts]) * 1e3 - med
      ax_t.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=impl)
      mem = [(x, p["temp_bytes"]) for x, p in pts if p.get("temp_bytes")]
      if mem:
        ax_m.plot([m[0] for m in mem], [m[1] / 2 ** 20 for m in mem], marker="o", label=impl)
    _log_axes(ax_t, "sequence length T", "time per call [ms] (median, min–max)")
    _log_axes(ax_m, "sequence length T", "compiled temp memory [MiB]")
    ax_t.legend(fontsize=7)
    fig.suptitle(f"attention {mode}, {dtype}, B={b} H={h} D={d}, "
                 f"{'causal' if causal else 'non-causal'}")
    fig.tight_layout()
    yield f"kernels_{mode}_{dtype}_b{b}_h{h}_d{d}_{'causal' if causal else 'full'}.png", fig


def _additive_figures(rows: list[dict], plt) -> Iterator[tuple[str, Any]]:
  """Temp memory vs T of chunked and naive additive attention, with a T² guide."""
  additive = [r for r in rows if r["suite"] == "additive" and r.get("temp_bytes")]
  if len({r["seq_len"] for r in additive}) < 2:
    return
  fig, ax = plt.subplots(figsize=(6, 4.2))
  for impl in sorted({r["impl"] for r in additive}):
    pts = sorted((r["seq_len"], r["temp_bytes"]) for r in additive if r["impl"] == impl)
    ax.plot([p[0] for p in pts], [p[1] / 2 ** 20 for p in pts], marker="o", label=impl)
  t0 = min(r["seq_len"] for r in additive)
  c0 = [r for r in additive if r["impl"] == "additive_chunked" and r["seq_len"] == t0]
  if c0:
    ts = np.array(sorted({r["seq_len"] for r in additive}))
    ax.plot(ts, c0[0]["temp_bytes"] / 2 ** 20 * (ts / t0) ** 2, "k:", label="∝ T² (Tq·Tk)")
  r0 = additive[0]
  _log_axes(ax, "sequence length T (Tq = Tk)", "compiled temp memory, fwd+bwd [MiB]")
  ax.set_title(f"additive attention, B={r0['batch']}, a={r0['attention_dim']}")
  ax.legend(fontsize=8)
  fig.tight_layout()
  yield "additive_memory.png", fig
