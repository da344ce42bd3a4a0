"""The reports of a sweep's workdir, rebuilt from its finished runs.

`write_reports` writes one workdir's results.jsonl, table.md and plots;
`write_grid_reports` the pivoted ones of a `--sweep` grid; `write` is either,
as the sweep calls it (`sweep.runner.Report`). A workdir whose runs have
member values (`--members`) reports as the `--sweep` grid it equals
(`write_member_reports`): the same rows, tables and plots, from one run
folder per arm and dim. For the Transformer both add
its diagnostics per attention kind and layer (its global ones are the cross
attention's); `significance` tests every arm against the baseline arm,
cached per run (`training.run_folder.RunDir` names the files). Tables and
plots are drawn by `tables` and `plots`, which look their cells up by (arm
name, row value).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from typing import Any, Sequence

from attention_jax.analysis import plots
from attention_jax.analysis import significance as significance_lib
from attention_jax.analysis import tables
from attention_jax.sweep import config as config_lib
from attention_jax.sweep.config import ExperimentConfig
from attention_jax.sweep.config import GridPoint
from attention_jax.sweep.workdir import restated
from attention_jax.sweep.workdir import UnreadableRuns
from attention_jax.sweep.workdir import Workdir
from attention_jax import files
from attention_jax.training.metrics_log import MetricsLog
from attention_jax.training.run_config import Arm
from attention_jax.training.run_folder import RunDir


def baseline_arm(cfg: ExperimentConfig) -> str:
  """The arm the others are tested against: `cfg.baseline`, else additive
  when swept, else the first."""
  if cfg.baseline:
    return cfg.baseline
  return "additive" if "additive" in cfg.arms else cfg.arms[0]


def _every_arm(cfg: ExperimentConfig) -> tuple[Arm, ...]:
  """Every arm at every dim, arms outer. Unlike `cfg.sweep()` it keeps the
  additive arm above `additive_max_dim`: that cap may be set after such a run
  finished (it does not change a run's numbers), and the run still reports."""
  return tuple(Arm.of(name, dim) for name in cfg.arms for dim in cfg.dims)


def _cells(by_arm: dict[Arm, Any]) -> dict[tuple[str, int], Any]:
  """`by_arm` keyed as `tables` and `plots` look up a cell."""
  return {(arm.name, arm.attention_dim): value for arm, value in by_arm.items()}


# Runs whose files could not be read, by folder: `{run path: one line naming
# the file and what to do}`. Given one, the reports read around such a run,
# leave it out and name it here; without one, its error is raised.
Problems = dict


def _left_out(run: RunDir, error: ValueError, problems: Problems | None) -> None:
  """Keeps `error` (reading a file of `run`) in `problems`, its remedy
  restated for a committed run (`workdir.restated`), or raises it without."""
  if problems is None:
    raise error
  problems.setdefault(run.path, restated(str(error), run))


def finished_rows(workdir: Workdir, cfg: ExperimentConfig,
                  problems: Problems | None = None) -> list[dict]:
  """The rows of every finished run of `cfg` in `workdir`, arms outer (with
  `problems`, those of the runs whose result.json reads)."""
  rows = []
  for arm in _every_arm(cfg):
    run = workdir.run(arm)
    if run.finished:
      try:
        rows.extend(run.rows())
      except ValueError as e:
        _left_out(run, e, problems)
  return rows


def _histories(workdir: Workdir, cfg: ExperimentConfig,
               problems: Problems | None = None) -> dict[Arm, list[dict]]:
  """The metrics-log rows of every run of `cfg` in `workdir` that logged any
  (with `problems`, of the runs whose log reads)."""
  out = {}
  for arm in _every_arm(cfg):
    run = workdir.run(arm)
    try:
      log = MetricsLog(run.metrics, write=False).read()
    except ValueError as e:
      _left_out(run, e, problems)
      continue
    if log:
      out[arm] = log
  return out


@dataclasses.dataclass(frozen=True)
class MemberSubset:
  """Some members of each run of a workdir: those of one combination of
  member values (`name`, e.g. 'learning_rate=0.001'), by their index in the
  runs' member order (`indices`, seed order)."""
  name: str
  indices: tuple[int, ...]


def significance(workdir: Workdir, cfg: ExperimentConfig,
                 subset: MemberSubset | None = None,
                 problems: Problems | None = None) -> dict[Arm, dict]:
  """Seed-paired AR tests (`significance.compare_runs`) of every finished arm
  against the baseline arm at the same dimension, cached per pair in the
  run's significance.json under the digest of both runs' translations and
  the result's `significance.FORMAT`; with `subset`, of those members only,
  cached apart (`RunDir.significance_of`). With `problems`, a run already
  in it is left out, and a pair whose translations do not read is left out
  and kept there under the run whose file it names (the compared one where
  both are named)."""
  base = baseline_arm(cfg)
  out = {}
  for dim in cfg.dims:
    base_run = workdir.run(Arm.of(base, dim))
    if base_run.stored_translations is None or base_run.path in (problems or {}):
      continue
    for name in cfg.arms:
      arm = Arm.of(name, dim)
      run = workdir.run(arm)
      if name == base or run.stored_translations is None or run.path in (problems or {}):
        continue
      try:
        out[arm] = _compare(base, base_run, run, subset)
      except ValueError as e:
        own = run.stored_translations in str(e) or base_run.stored_translations not in str(e)
        _left_out(run if own else base_run, e, problems)
        if not own:
          break  # the baseline's own file: no other arm compares at this dimension
  return out


def _compare(base: str, base_run: RunDir, run: RunDir,
             subset: MemberSubset | None = None) -> dict:
  """`run` against the baseline's `base_run` (of the members of `subset`
  only, if given): the cached result if it was computed from the same
  translations (and members) in the current format, else computed and
  cached."""
  base_bytes, own_bytes = base_run.translations_bytes(), run.translations_bytes()
  chosen = b"" if subset is None else b"\0" + repr(subset.indices).encode()
  digest = hashlib.sha256(base_bytes + b"\0" + own_bytes + chosen).hexdigest()
  cache = run.significance if subset is None else run.significance_of(subset.name)
  cached = None
  if os.path.exists(cache):
    try:
      cached = files.read_json(cache, dict)
    except ValueError:  # cut by a kill, or damaged: recomputed
      cached = None
  if (cached is not None and cached.get("digest") == digest
      and cached.get("format", 1) == significance_lib.FORMAT):
    return cached["result"]
  # Read and checked as a pair: a damaged file, or references that differ, named.
  pair = translations_to_compare(base_run, run)
  name = f"{os.path.basename(run.path)} against {os.path.basename(base_run.path)}"
  if subset is not None:
    pair = tuple({"references": t["references"],
                  "hypotheses": [t["hypotheses"][e] for e in subset.indices]} for t in pair)
    name += f" at {subset.name}"
  print(f"significance: {name}, {len(pair[0]['references'])} sentences, "
        f"{significance_lib.TRIALS:,} paired shuffles per seed pair ...", flush=True)
  start = time.time()
  result = significance_lib.compare_runs(*pair)
  print(f"significance: {name} done in {time.time() - start:.0f} s", flush=True)
  files.atomic_write(cache, files.to_json(
      {"baseline": base, "digest": digest, "format": significance_lib.FORMAT,
       "result": result}))
  return result


def translations_to_compare(base: RunDir, other: RunDir) -> tuple[dict, dict]:
  """The test translations of the runs `base` and `other` (`test_translations`),
  which must be of the same references: a ValueError of one line naming both
  files if not (one was cut or comes from another test set)."""
  first, second = base.test_translations(), other.test_translations()
  if first["references"] != second["references"]:
    differ = ("a different number of references "
              f"({len(first['references'])} and {len(second['references'])})"
              if len(first["references"]) != len(second["references"])
              else "different references")
    raise ValueError(f"{base.stored_translations} and {other.stored_translations} hold {differ}, "
                     "so their runs cannot be compared; delete the wrong one and its run's "
                     "result.json, and re-run the same command to evaluate that run again "
                     "(a committed run's: restore it with `git checkout -- PATH`).")
  return first, second


def _test_set(cfg: ExperimentConfig) -> str:
  return f"first {cfg.test_examples} test sentences" if cfg.test_examples else "test split"


def _left_out_note(problems: Problems | None) -> list[str]:
  """The paragraph of a table.md that names the runs left out of it."""
  if not problems:
    return []
  return ["Left out, their files unreadable (the driver names each with what to do): "
          + ", ".join(sorted(problems)) + ".\n"]


def write_reports(workdir: Workdir, cfg: ExperimentConfig,
                  problems: Problems | None = None) -> str:
  """Regenerates results.jsonl, table.md and the plots from the finished runs
  (as a grid's, `write_member_reports`, where the runs have member values);
  with `problems`, around the runs whose files do not read, named there."""
  if cfg.members:
    return write_member_reports(workdir, cfg, problems)
  rows = finished_rows(workdir, cfg, problems)
  files.write_jsonl(workdir.results, rows)
  settings = (f"model={cfg.model}, dataset={cfg.dataset}, steps={cfg.steps}, "
              f"{cfg.seeds} seed{'s' if cfg.seeds != 1 else ''}")
  parts = [
      f"Test BLEU (sacrebleu, beam {cfg.beam_size}, {_test_set(cfg)}), mean ± std (max) "
      f"over seeds; {settings}.\n\n" + tables.britz_table(rows, cfg.arms, cfg.dims)]
  if any("val_ppl" in r for r in rows):
    parts.append(
        "Validation perplexity (teacher-forced, per target token, whole validation split; "
        "parameters of the best validation BLEU), mean ± std (min) over seeds.\n\n"
        + tables.britz_table(rows, cfg.arms, cfg.dims, metric="val_ppl", best=min))
  tests = significance(workdir, cfg, problems=problems)
  if tests:
    parts.append(
        f"Test BLEU difference to {baseline_arm(cfg)} at the same dimension, mean over "
        "seed pairs, with the largest p over the pairs (paired approximate randomisation "
        f"over test sentences, {significance_lib.TRIALS:,} trials, ties counted).\n\n"
        + tables.significance_table(_cells(tests), cfg.arms, cfg.dims, baseline_arm(cfg)))
  if tables.has_kinds(rows):  # the Transformer: every attention kind and layer
    layers = not tables.one_layer_per_kind(rows)
    for caption, (stat, per_layer) in _kind_captions(layers):
      parts.append(f"{caption}.\n\n" + tables.kind_table(rows, cfg.arms, cfg.dims, stat,
                                                            per_layer=per_layer))
    if not layers:
      parts.append(_ONE_LAYER_NOTE)
  text = "\n".join(parts + _left_out_note(problems))
  files.atomic_write(workdir.table, text)
  if rows:
    plots.plot_ablation(rows, cfg.arms, workdir.ablation_plot)
  _attention_plots(workdir, cfg, "seed 0", problems)
  histories = _cells(_histories(workdir, cfg, problems))
  if histories:
    plots.plot_diagnostics(histories, cfg.arms, workdir.diagnostics_plot)
    plots.plot_validation(histories, cfg.arms, workdir.validation_plot)
    if tables.has_kinds(r for log in histories.values() for r in log):
      plots.plot_kinds_history(histories, cfg.arms, workdir.kinds_plot)
  return text


def _attention_plots(workdir: Workdir, cfg: ExperimentConfig, member: str,
                     problems: Problems | None = None) -> None:
  """The heat map of each finished run's test sentence 0, from its first
  member (`member` names it in the title); with `problems`, of the runs not
  in it whose attention.json reads."""
  for arm in _every_arm(cfg):
    run = workdir.run(arm)
    if os.path.exists(run.attention) and run.finished and run.path not in (problems or {}):
      try:
        attention = files.read_json(
            run.attention, dict, "delete it (the run's heat map is then left out)")
      except ValueError as e:
        _left_out(run, e, problems)
        continue
      plots.plot_attention(attention, f"{arm.name}, a={arm.attention_dim}, {member}",
                           workdir.attention_plot(arm))


def write(workdir: Workdir, cfg: ExperimentConfig,
          grid: Sequence[GridPoint] | None = None) -> str:
  """The reports the sweep asks for (`sweep.runner.Report`): with `grid`,
  those of the grid in `workdir` (`write_grid_reports`), else those of the
  one workdir (`write_reports`); returns its table. A run whose files do
  not read is left out, and once every report is written,
  `workdir.UnreadableRuns` names each such run: one damaged file stops
  neither the reports of the others nor, in the sweep, their training."""
  problems = {}
  if grid is None:
    text = write_reports(workdir, cfg, problems)
  else:
    text = write_grid_reports(workdir, cfg, grid, problems)
  if problems:
    raise UnreadableRuns(text, problems)
  return text


# What the per-kind tables say of how a kind's layers are summarised.
_KIND_SUMMARIES = {"max_logit": "the largest over its layers",
                   "saturated": "the largest over its layers",
                   "entropy": "the lowest over its layers"}
_KIND_NAMES = {"max_logit": "Largest attention logit (raw score before the softmax)",
               "saturated": "Share of query rows whose largest weight exceeds 0.99",
               "entropy": "Attention entropy / log(number of valid keys)"}


# Said where the tables per kind and layer are left out (`_kind_captions`).
_ONE_LAYER_NOTE = ("Each attention kind has one layer here: its tables per kind and layer "
                   "would repeat the tables above, and are left out.\n")


def _kind_captions(layers: bool = True):
  """(caption, (statistic, per layer)) of each per-kind table, in order:
  the three statistics per kind (the main tables), then, with `layers`, per
  kind and layer (without: a model of one layer per kind, whose tables per
  layer would be the same numbers again). Why per kind: the Transformer's
  global diagnostics (`max_logit`, ...) are its cross attention's, and in
  `dot` the self attentions fail first."""
  for per_layer in (False, True) if layers else (False,):
    for stat, _, _ in tables.KIND_STATS:
      where = ("per attention kind and layer" if per_layer else
               f"per attention kind ({_KIND_SUMMARIES[stat]})")
      yield (f"{_KIND_NAMES[stat]} {where} at the end of training (validation batch), "
             "mean over seeds", (stat, per_layer))


def _final_max_logit(row: dict) -> dict:
  """The row with its end-of-training max attention logit at the top level."""
  return {**row, "max_logit": (row.get("diagnostics") or {}).get("max_logit")}


def _slices(cfg: ExperimentConfig, points: Sequence[GridPoint], axis: str):
  """(fixed values of the further axes, dim, caption) of every table of a
  grid report: one table per dim and value of every further axis, arms
  against `axis`."""
  first = points[0].values[axis]
  for p in points:
    if p.values[axis] != first:
      continue
    fixed = {k: v for k, v in p.values.items() if k != axis}
    for dim in cfg.dims:
      yield fixed, dim, ", ".join([f"a = {dim}"] + [f"{k} = {v}" for k, v in fixed.items()])


_GRID_SECTIONS = (
    ("val_ppl", min, "Validation perplexity (teacher-forced, per target token, whole "
                     "validation split; parameters of the best validation BLEU), "
                     "mean ± std (min) over seeds"),
    ("max_logit", max, "Largest attention logit at the end of training (validation "
                       "batch; raw score before the softmax), mean ± std (max) over seeds"),
)


@dataclasses.dataclass(frozen=True)
class PointResults:
  """What one point of a grid holds for the grid's reports: its finished
  rows (each with the point's values and its final `max_logit`), its
  significance tests by arm and its metrics logs by (arm, dim)."""
  point: GridPoint
  rows: list[dict]
  tests: dict[Arm, dict]
  histories: dict[tuple[str, int], list[dict]]


def _point_folders(workdir: Workdir, cfg: ExperimentConfig, points: Sequence[GridPoint],
                   problems: Problems | None = None) -> list[PointResults]:
  """The results of a `--sweep` grid: a workdir per point."""
  out = []
  for p in points:
    folder = workdir.point(p)
    rows = [_final_max_logit({**r, **p.values})
            for r in finished_rows(folder, p.config, problems)]
    tests = significance(folder, p.config, problems=problems) if rows else {}
    out.append(PointResults(p, rows, tests, _cells(_histories(folder, cfg, problems))))
  return out


def member_points(cfg: ExperimentConfig) -> tuple[GridPoint, ...]:
  """The `--sweep` grid whose runs the members of `cfg`'s runs equal: a
  point per combination of member values (`--members=learning_rate=a,b` is
  `--sweep=learning_rate=a,b`), each point's config that of its separate runs."""
  return config_lib.grid(cfg.replace(members=""), cfg.member_axes())


def _member_results(workdir: Workdir, cfg: ExperimentConfig, points: Sequence[GridPoint],
                    problems: Problems | None = None) -> list[PointResults]:
  """The results of a run with member values as its grid's `points`: each
  point's rows, tests and logs are those of its members in every run of
  `workdir`, found by the values their rows and log lines carry."""
  rows = finished_rows(workdir, cfg, problems)
  histories = _cells(_histories(workdir, cfg, problems))
  members = cfg.run_members()
  out = []
  for p in points:
    mine = lambda r, p=p: all(r.get(k) == v for k, v in p.values.items())
    point_rows = [_final_max_logit({**r, **p.values}) for r in rows if mine(r)]
    subset = MemberSubset(p.name, tuple(e for e, m in enumerate(members) if mine(m.keys)))
    tests = significance(workdir, cfg, subset, problems) if point_rows else {}
    logs = {cell: [r for r in log if mine(r)] for cell, log in histories.items()}
    out.append(PointResults(p, point_rows, tests, {c: log for c, log in logs.items() if log}))
  return out


def write_member_reports(workdir: Workdir, cfg: ExperimentConfig,
                         problems: Problems | None = None) -> str:
  """The reports of a workdir whose runs have member values (`--members`):
  those of the `--sweep` grid they equal (`member_points`,
  `write_grid_reports`: the same results.jsonl rows, tables and plots), and
  each run's attention heat map (its first member's), and validation.png:
  validation BLEU, perplexity and the training loss over training, a column
  per member value (a grid has them in each point's folder)."""
  points = member_points(cfg)
  results = _member_results(workdir, cfg, points, problems)
  text = _write_grid(workdir, cfg, points, results, "each run's config.json", problems)
  histories = {r.point.name: r.histories for r in results if r.histories}
  if histories:
    plots.plot_history_panels(
        histories, cfg.arms, [("val_bleu", "validation BLEU", "linear"),
                              ("val_ppl", "validation perplexity", "log"),
                              ("loss", "training loss", "log")],
        workdir.validation_plot, note=plots.seeds_note(
            {name: log for by_cell in histories.values() for name, log in by_cell.items()}))
  first = cfg.run_members()[0]
  _attention_plots(workdir, cfg, first.label, problems)
  return text


def write_grid_reports(workdir: Workdir, cfg: ExperimentConfig, points: Sequence[GridPoint],
                       problems: Problems | None = None) -> str:
  """The reports of a `--sweep` grid from the finished runs of every point:
  results.jsonl (each row with the point's swept values), table.md (arms
  against the first axis), sweep_<axis>.png and max_logit.png (the largest
  logit over training, a panel per point). A Transformer's grid has it per
  attention kind instead of its cross attention's only: table.md's per-kind
  and per-layer sections, max_logit.png a row per kind, and kinds.png."""
  return _write_grid(workdir, cfg, points, _point_folders(workdir, cfg, points, problems),
                     "each point's config.json", problems)


def _write_grid(workdir: Workdir, cfg: ExperimentConfig, points: Sequence[GridPoint],
                results: Sequence[PointResults], settings_in: str,
                problems: Problems | None = None) -> str:
  """`write_grid_reports` of the grid `points` from their `results`;
  `settings_in` says where every other setting is recorded; `problems` the
  runs left out."""
  axis = next(iter(points[0].values))
  axis_values = tuple(dict.fromkeys(p.values[axis] for p in points))
  rows, tests, histories = [], {}, {}
  for result in results:
    rows.extend(result.rows)
    if result.tests:
      tests[result.point.name] = result.tests
    if result.histories:
      histories[result.point.name] = result.histories
  files.write_jsonl(workdir.results, rows)

  swept = set(points[0].values)
  beam = "swept" if {"beam_size", "test_examples"} & swept else (
      f"beam {cfg.beam_size}, {_test_set(cfg)}")
  sections = ((("test_bleu", max, f"Test BLEU (sacrebleu, {beam}), mean ± std (max) over "
                                  "seeds"),) + _GRID_SECTIONS)
  fixed_settings = ", ".join(f"{k}={getattr(cfg, k)}" for k in ("model", "dataset", "steps",
                                                                "seeds") if k not in swept)
  parts = [f"Grid over {', '.join(f'`{k}`' for k in points[0].values)}; tables by "
           f"`{axis}` = {', '.join(map(str, axis_values))}; {fixed_settings} (every other "
           f"setting as in {settings_in}).\n"]
  kinds = tables.has_kinds(rows)
  if kinds:  # the global max_logit is the cross attention's: the kinds below have all three
    sections = tuple(s for s in sections if s[0] != "max_logit")
  for metric, best, caption in sections:
    parts.append(f"## {caption}\n")
    for fixed, dim, where in _slices(cfg, points, axis):
      subset = [{**r, "dim": r[axis]} for r in rows if r["dim"] == dim
                and all(r.get(k) == v for k, v in fixed.items())]
      parts.append(f"{where}:\n\n" + tables.britz_table(
          subset, cfg.arms, axis_values, metric=metric, best=best, params=False,
          row_label=axis))
  if tests:
    parts.extend(_grid_significance(cfg, points, axis, axis_values, tests))
  if kinds:
    layers = not tables.one_layer_per_kind(rows)
    for caption, (stat, per_layer) in _kind_captions(layers):
      parts.append(f"## {caption}\n")
      for fixed, dim, where in _slices(cfg, points, axis):
        subset = [{**r, "dim": r[axis]} for r in rows if r["dim"] == dim
                  and all(r.get(k) == v for k, v in fixed.items())]
        parts.append(f"{where}:\n\n" + tables.kind_table(
            subset, cfg.arms, axis_values, stat, row_label=axis, per_layer=per_layer))
    if not layers:
      parts.append(_ONE_LAYER_NOTE)
  text = "\n".join(parts + _left_out_note(problems))
  files.atomic_write(workdir.table, text)
  if rows:
    plots.plot_sweep(rows, cfg.arms, axis, workdir.sweep_plot(axis))
    if kinds:
      plots.plot_kinds_sweep(rows, cfg.arms, axis, workdir.kinds_plot)
  if histories:
    if kinds:  # a row of panels per kind, each the largest over its layers
      panels = [(f"max_logit_{kind}", f"largest logit, {kind.replace('_', ' ')}")
                for kind in tables.KINDS]
      histories = {name: {cell: [tables.with_kind_values(r) for r in log]
                          for cell, log in by_cell.items()}
                   for name, by_cell in histories.items()}
    else:
      panels = [("max_logit", "largest attention logit")]
    plots.plot_history_panels(histories, cfg.arms, panels, workdir.max_logit_plot)
  return text


def _grid_significance(cfg: ExperimentConfig, points: Sequence[GridPoint], axis: str,
                       axis_values: tuple, tests: dict[str, dict[Arm, dict]]) -> list[str]:
  """The significance section of a grid's table.md: one table per slice,
  arms against `axis`, from `tests[point name][arm]`."""
  base = baseline_arm(cfg)
  parts = [f"## Test BLEU difference to {base} at the same dimension and {axis}, mean "
           "over seed pairs, with the largest p over the pairs (paired approximate "
           f"randomisation over test sentences, {significance_lib.TRIALS:,} trials, ties "
           "counted)\n"]
  for fixed, dim, where in _slices(cfg, points, axis):
    keyed = {}
    for p in points:
      if all(p.values[k] == v for k, v in fixed.items()):
        for name in cfg.arms:
          result = tests.get(p.name, {}).get(Arm.of(name, dim))  # None: not finished
          if result is not None:
            keyed[(name, p.values[axis])] = result
    parts.append(f"{where}:\n\n" + tables.significance_table(
        keyed, cfg.arms, axis_values, base, row_label=axis))
  return parts
