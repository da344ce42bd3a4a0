"""The compile check's report: a Markdown table per program and one of every row.

Each row is what XLA said of one compiled program for one target
(`compile_device.compile_case`): memory, FLOPs, predicted time. The tables
are written next to the rows, `<out>/<target>.md` beside `<out>/<target>.jsonl`,
and can be rewritten from the rows alone (`report_only`).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterable, Mapping, Sequence

from attention_jax.analysis import tables
from attention_jax.measure import compile_targets
from attention_jax.measure import provenance as provenance_lib


def format_gb(n) -> str:
  """Bytes as GB with two decimals; '–' for none."""
  return "–" if n is None else f"{n / 1e9:.2f}"


def format_seconds(s) -> str:
  """Seconds in the unit that reads best (min, s, ms, µs); '–' for none."""
  if s is None:
    return "–"
  if s < 0:  # libtpu's optimal_seconds of some loop programs
    return f"{s:.3g} s (negative)"
  if s >= 60:
    return f"{s / 60:.1f} min"
  if s >= 1:
    return f"{s:.2f} s"
  if s >= 1e-3:
    return f"{s * 1e3:.2f} ms"
  return f"{s * 1e6:.0f} µs"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """One line per row: program, case, status, memory (GB) and verdict, FLOPs,
  predicted time, the fused attention kernel if any."""
  body = []
  for r in rows:
    ok = r.get("status") == "compiled"
    status = "compiled" if ok else f"error: {str(r.get('error', ''))[:80]}"
    verdict = "–" if r.get("fits") is None else ("yes" if r["fits"] else "**no**")
    flops = r.get("flops")
    body.append([
        r["program"], r["case"], status, format_gb(r.get("argument_bytes")),
        format_gb(r.get("output_bytes")), format_gb(r.get("temp_bytes")),
        format_gb(r.get("total_bytes")), verdict,
        "–" if flops is None else f"{flops / 1e9:,.1f}", format_seconds(r.get("predicted_s")),
        format_seconds(r.get("target_optimal_seconds")), r.get("fused_attention") or "–"])
  return tables.markdown(
      ["program", "case", "status", "args GB", "out GB", "temp GB", "total GB", "fits", "GFLOP",
       "predicted", "TPU optimal_s (loops once)", "kernel"], body,
      align=[None, None, None, "r", "r", "r", "r", None, "r", "r", "r", None])


def sweep_seconds(rows: Iterable[Mapping[str, Any]], program: str = "gpu_sweep",
                  key: str = "predicted_s") -> float | None:
  """Predicted training time of a whole sweep: Σ steps × the rows' `key`
  (`predicted_s`, or `roofline_s` for the bound without overheads) over the
  rows of `program` (None when one failed or none ran)."""
  chosen = [r for r in rows if r["program"] == program]
  if not chosen or any(r.get(key) is None or not r.get("steps") for r in chosen):
    return None
  return sum(r["steps"] * r[key] for r in chosen)


def _count(n) -> str:
  return "–" if n is None else f"{n:,}"


def _compiled(rows, program):
  return [r for r in rows if r["program"] == program and r.get("status") == "compiled"]


def sweep_table(rows: Sequence[Mapping[str, Any]], target: compile_targets.Target) -> str:
  """Per (arm, dim) of the sweep: memory, step time (FLOPs at peak alone, the
  roofline, and with overheads) and the time of its steps."""
  body = []
  for r in _compiled(rows, "gpu_sweep"):
    flops = r.get("flops")
    body.append([
        r["case"], format_gb(r.get("total_bytes")), "yes" if r.get("fits") else "**no**",
        "–" if flops is None else f"{flops / 1e9:,.0f}",
        "–" if flops is None else format_seconds(flops / target.peak_flops),
        format_seconds(r.get("roofline_s")), format_seconds(r.get("predicted_s")),
        _count(r.get("kernels")), _count(r.get("loop_iterations")), _count(r.get("steps")),
        format_seconds(r.get("predicted_total_s"))])
  return tables.markdown(
      ["arm", "total GB", "fits", "GFLOP / step", "FLOPs at peak", "roofline step",
       "predicted step", "kernels / step", "loop iterations / step", "steps", "predicted time"],
      body, align=[None, "r", None] + ["r"] * 8)


def kernel_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Per kernel case: memory, predicted time and TFLOP/s by the benchmark's
  FLOP count (FlashAttention convention), the fused kernel if any, and the
  kernels that only rearrange data with the bytes they move (– in rows
  compiled before they were counted)."""
  body = []
  for r in rows:
    if r["program"] != "kernels":
      continue
    if r.get("status") != "compiled":  # the error, and blank cells after it
      body.append([r["case"], f"error: {str(r.get('error', ''))[:100]}"])
      continue
    tflops = r.get("predicted_tflops")
    copies = ("–" if r.get("layout_copies") is None else
              f"{r['layout_copies']} ({format_gb(r.get('layout_copy_bytes'))} GB)")
    body.append([r["case"], format_gb(r.get("total_bytes")),
                  "yes" if r.get("fits") else "**no**", format_seconds(r.get("predicted_s")),
                  "–" if tflops is None else f"{tflops:.0f}",
                  "yes" if r.get("fused_attention") == "cudnn" else "no", copies])
  return tables.markdown(
      ["case", "total GB", "fits", "predicted", "TFLOP/s (benchmark count)", "cuDNN",
       "layout copies (GB moved)"], body,
      align=[None, "r", None, "r", "r", None, "r"], fill=True)


def additive_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Temporary memory of the chunked and the naive additive score over T."""
  by_t: dict[int, dict[str, Mapping]] = {}
  for r in rows:
    if r["program"] == "additive":
      by_t.setdefault(r["shapes"]["seq_len"], {})[r["shapes"]["impl"]] = r

  def cell(r):
    if r is None:
      return "–"
    if r.get("status") != "compiled":
      return "error"
    return f"{format_gb(r['temp_bytes'])}{'' if r.get('fits') else ' (does not fit)'}"

  if any("additive_pallas" in forms for forms in by_t.values()):
    return _additive_table_with_pallas(by_t, cell)
  body = []
  for t in sorted(by_t):
    c, n = by_t[t].get("additive_chunked"), by_t[t].get("additive_naive")
    body.append([t, cell(c), cell(n), format_seconds((c or {}).get("predicted_s")),
                  format_seconds((n or {}).get("predicted_s"))])
  return tables.markdown(
      ["T", "chunked temp GB", "naive temp GB", "chunked predicted", "naive predicted"], body,
      align="rrrrr")


def _additive_table_with_pallas(by_t, cell) -> str:
  """Temporaries, counted GFLOP and predicted time of the three forms over T."""
  forms = ("additive_pallas", "additive_chunked", "additive_naive")
  names = [f.split("_")[1] for f in forms]
  header = (["T"] + [f"{n} temp GB" for n in names] + [f"{n} GFLOP" for n in names]
            + [f"{n} predicted" for n in names])
  body = []
  for t in sorted(by_t):
    rows = [by_t[t].get(f) or {} for f in forms]
    flops = [("–" if r.get("flops") is None else f"{r['flops'] / 1e9:,.0f}") for r in rows]
    body.append([t, *(cell(r or None) for r in rows), *flops,
                  *(format_seconds(r.get("predicted_s")) for r in rows)])
  return tables.markdown(header, body, align="r" * len(header))


def format_collectives(collectives) -> str:
  """A step's collectives in one cell: 'none', or per kind and group size
  `kind x count (GB, group g)`, the bytes summed over the executions."""
  if collectives is None:
    return "–"
  if not collectives:
    return "none"
  return "; ".join(f"{c['kind']} ×{c['count']} ({c['bytes'] / 1e9:.3f} GB, group "
                   f"{c['group_size']})" for c in collectives)


MESH_PROGRAMS = {
    "gpu_members": "`gpu` preset, members split over devices",
    "gpu_members_data": "`gpu` preset, members × data",
    "gpu_data": "`gpu` preset, data parallel (today)",
    "lr_grid": "learning-rate grid, one program of 21 members per cell",
    "lr_grid_data": "learning-rate grid, a run of 3 seeds per rate, data parallel (today)",
}


def mesh_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Per multi-device program: its layout (scheme, devices, mesh, hosts,
  members), per-device memory, FLOPs per device (loop-aware, and the
  target's own count where it gives one: libtpu's, loop bodies once), the
  step's collectives and their predicted time, the predicted step and the
  time of its runs."""
  body = []
  for r in rows:
    if "num_devices" not in r:
      continue
    mesh = r.get("mesh") or {}
    layout = [r["program"], r["case"], r["scheme"], r["num_devices"],
              f"{mesh.get('members')} × {mesh.get('data')}", r.get("hosts"),
              f"{r.get('members')} ({r.get('padding', 0)})"]
    if r.get("status") != "compiled":  # the error, and blank cells after it
      body.append([*layout, f"error: {str(r.get('error', ''))[:100]}"])
      continue
    flops, own = r.get("flops"), r.get("target_flops")
    body.append([
        *layout, format_gb(r.get("total_bytes")), "yes" if r.get("fits") else "**no**",
        "–" if flops is None else f"{flops / 1e9:,.0f}",
        "–" if own is None else f"{own / 1e9:,.0f}", format_collectives(r.get("collectives")),
        format_seconds(r.get("collective_s")), format_seconds(r.get("predicted_s")),
        f"{r.get('runs', 1)} × {_count(r.get('steps'))}",
        format_seconds(r.get("predicted_total_s"))])
  return tables.markdown(
      ["program", "case", "scheme", "num_devices", "mesh (members × data)", "hosts",
       "members (padding)", "memory / device GB", "fits", "GFLOP / device / step",
       "target's GFLOP (loops once)", "collectives", "collective time", "predicted step",
       "runs × steps", "predicted total"], body,
      align=[None, None, None, "r", None, "r", "r", "r", None, "r", "r", None, "r", "r", "r", "r"],
      fill=True)


def mesh_totals(rows: Sequence[Mapping[str, Any]],
                planned: Sequence[tuple[str, str]] | None = None) -> str:
  """Per multi-device program: the predicted time of all its runs (the `gpu`
  sweep's 12 cells, or the grid's runs), one after another, with how much of
  it the collectives take; '–' where one of its programs did not compile.
  Where `planned` (the run's (program, case) pairs) has cases of a program
  without a row, its times say how many cases they cover ('for 2 of 4 cases'):
  a run cut part-way must not read as the program's whole."""
  body = []
  for program, title in MESH_PROGRAMS.items():
    chosen = [r for r in rows if r.get("program") == program and "num_devices" in r]
    if not chosen:
      continue
    done = all(r.get("predicted_total_s") is not None for r in chosen)
    total = sum(r["predicted_total_s"] for r in chosen) if done else None
    comm = (sum(r.get("runs", 1) * r["steps"] * r["collective_s"] for r in chosen)
            if done else None)
    devices = sorted({r["num_devices"] for r in chosen})
    wanted = {case for p, case in planned or () if p == program} | {r["case"] for r in chosen}
    part = "" if len(chosen) >= len(wanted) else f" for {len(chosen)} of {len(wanted)} cases"
    body.append([title, ", ".join(map(str, devices)),
                  f"{format_seconds(total)}{part if total is not None else ''}",
                  f"{format_seconds(comm)}{part if comm is not None else ''}"])
  return tables.markdown(
      ["program", "num_devices", "predicted wall time", "of which collectives"], body,
      align=[None, "r", "r", "r"])


def gpu_sweep_cells() -> list[str]:
  """The case names of the `gpu` preset's cells (arm and dimension), as the
  compile check names its `gpu_sweep` rows."""
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  return [arm.label for arm in config_lib.from_preset("gpu").sweep()]


def coverage(rows: Sequence[Mapping[str, Any]],
             planned: Sequence[tuple[str, str]] | None) -> str | None:
  """One line where some of the run's `planned` (program, case) pairs have no
  row (a run stopped part-way, or still compiling); None where all have one or
  no plan is known."""
  if not planned:
    return None
  have = {(r.get("program"), r.get("case")) for r in rows}
  wanted = list(dict.fromkeys(tuple(p) for p in planned))
  missing = [p for p in wanted if p not in have]
  if not missing:
    return None
  programs = ", ".join(f"`{p}`" for p in dict.fromkeys(p for p, _ in missing))
  return (f"**Part of a run: {len(wanted) - len(missing)} of {len(wanted)} cases have a row; "
          f"{len(missing)} not compiled ({programs}): the run stopped or is still going; "
          f"`--resume` compiles the rest.**\n")


def provenance(rows: Sequence[Mapping[str, Any]]) -> str:
  """How the rows were made: one sentence when every row has the same
  commit, command and versions; otherwise one line per (commit, command,
  versions) naming its programs, in the rows' order, so that rows added
  later (`--resume`) at another commit are not credited to the first's."""
  groups: dict[tuple, list[Mapping[str, Any]]] = {}
  for r in rows:
    # Its provenance: under `provenance`, or at the top level of the older rows.
    made = {**provenance_lib.of(r), "program": r["program"]}
    key = (provenance_lib.commit_label(made), made["command"],
           json.dumps(made["versions"], sort_keys=True))
    groups.setdefault(key, []).append(made)
  if len(groups) == 1:
    (commit, command, _), (first, *_) = next(iter(groups.items()))
    return (f"Compiled on a CPU-only host with {json.dumps(first['versions'])}, "
            f"commit {commit}, {first['date']}: `{command}`.\n")
  versions = {key[2] for key in groups}
  lines = ["Compiled on a CPU-only host"
           + (f" with {json.dumps(next(iter(groups.values()))[0]['versions'])}"
              if len(versions) == 1 else "")
           + ", in parts:"]
  for (commit, command, _), chosen in groups.items():
    programs = ", ".join(f"`{p}`" for p in dict.fromkeys(r["program"] for r in chosen))
    extra = "" if len(versions) == 1 else f" with {json.dumps(chosen[0]['versions'])}"
    lines.append(f"- {programs} ({len(chosen)} row(s)): commit {commit}, "
                 f"{chosen[0]['date']}{extra}: `{command}`")
  return "\n".join(lines) + "\n"


def summary(rows: Sequence[Mapping[str, Any]], target: compile_targets.Target,
            planned: Sequence[tuple[str, str]] | None = None) -> str:
  """The markdown report: the target, the sweep prediction, a table per
  program and every row. `planned`: the (program, case) pairs of the run
  that wrote the rows, where known; the report then says which of them have
  no row. The sweep prediction always names the `gpu` preset's cells it
  covers."""
  parts = [f"# Compile check: {target.description}\n",
           f"Device memory {target.memory_bytes / 1e9:.1f} GB (a program fits when arguments + "
           f"outputs + temporaries - aliased ≤ 90% of it); peak {target.peak_flops / 1e12:.0f} "
           f"TFLOP/s bf16, {target.bandwidth / 1e12:.2f} TB/s; overhead per kernel "
           f"{target.kernel_overhead_s * 1e6:g} µs and per loop iteration "
           f"{target.iteration_overhead_s * 1e6:g} µs (assumed).\n"]
  if target.devices > 1:
    parts.append(f"{target.devices} devices on {target.hosts} host(s); collectives: "
                 f"{target.link_bandwidth / 1e9:.0f} GB/s per device and "
                 f"{target.collective_overhead_s * 1e6:g} µs each (assumed), not overlapped "
                 "with compute.\n")
  if rows:
    parts.append(provenance(rows))
  part = coverage(rows, planned)
  if part:
    parts.append(part)
  sweep = sweep_seconds(rows)
  if sweep is not None:
    compute = sum(r["steps"] * r["flops"] / target.peak_flops
                  for r in rows if r["program"] == "gpu_sweep")
    # A sum over the cells compiled: with some missing (a run cut part-way,
    # `--cases`) it is not the sweep's time, so it says what it covers.
    cells = gpu_sweep_cells()
    have = {r["case"] for r in rows if r["program"] == "gpu_sweep"}
    missing = [c for c in cells if c not in have]
    of = "" if not missing else f" for {len(have)} of {len(cells)} cells"
    what = ("every arm and dimension" if not missing else
            f"only the cells compiled; not compiled: {', '.join(missing)}")
    parts.append(f"Predicted training time of the `gpu` sweep ({what}, "
                 f"training steps only, no evaluation or decoding): "
                 f"**{format_seconds(sweep)}{of}**; "
                 f"the roofline alone (no overheads) "
                 f"{format_seconds(sweep_seconds(rows, key='roofline_s'))}{of}, "
                 f"the FLOPs at peak alone "
                 f"{format_seconds(compute)}{of}.\n")
  for program, title, table in (
      ("gpu_sweep", "The `gpu` preset's training step (seeds vmapped, widest batch)",
       functools.partial(sweep_table, target=target)),
      ("kernels", "Kernel benchmark headline shapes", kernel_table),
      ("additive", "Additive score, a = 1024, forward+backward", additive_table)):
    if any(r["program"] == program for r in rows):
      parts.append(f"## {title}\n\n{table(rows)}")
  if any("num_devices" in r for r in rows):
    parts.append("## Predicted wall time of each program's runs\n\n"
                 + mesh_totals(rows, planned))
    parts.append("## Multi-device programs\n\n" + mesh_table(rows))
  parts.append(f"## Every program\n\n{markdown_table(rows)}")
  return "\n".join(parts)


def report_only(out: str, target: compile_targets.Target) -> str:
  """Rewrites `<out>/<target>.md` from `<out>/<target>.jsonl`; returns it."""
  path = os.path.join(out, target.name + ".jsonl")
  if not os.path.exists(path):
    raise ValueError(f"`--out` {out} has no {target.name}.jsonl to report.")
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  write_report(out, target, rows, jsonl=False)
  return summary(rows, target)


def write_report(out: str, target: compile_targets.Target, rows: list[dict],
                 jsonl: bool = True, planned: Sequence[tuple[str, str]] | None = None) -> None:
  """`<out>/<target>.md` from `rows` and, with `jsonl`, the rows as `<out>/<target>.jsonl`;
  each file replaced whole (a killed run leaves the previous one, not half of it).
  `planned`: the run's (program, case) pairs (`summary`)."""
  files = [(".md", summary(rows, target, planned))]
  if jsonl:
    files.append((".jsonl", "".join(json.dumps(r) + "\n" for r in rows)))
  for suffix, text in files:
    path = os.path.join(out, target.name + suffix)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(path + ".tmp", path)

