"""Which attention kind's logits grow first, and when: a Transformer sweep's per-kind history.

The Transformer logs softmax diagnostics per attention kind (`encoder_self`,
`decoder_self`, `cross`) and layer in every run's metrics log
(`max_logit_<kind>_l<layer>`, `saturated_<kind>_l<layer>`). The sweep's own
reports show them at the end of training; this reads them over training:

- the largest logit of each kind (the largest over its layers, mean over
  seeds) at the first diagnostics step and at the last, with the share of
  saturated rows (largest weight > 0.99) at the last step;
- the first diagnostics step at which a kind has at least half of its rows
  saturated in some layer, in every seed.

The runs are found through the workdir's own layout (`sweep.workdir.Workdir`,
one folder per grid point of a `--sweep`) from the sweep's config, as the
reports find them, never by the spelling of its folders.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from attention_jax.analysis import tables
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir as workdir_lib
from attention_jax.training import metrics_log

# Share of saturated rows that counts as "the softmax has saturated".
HALF = 0.5
KINDS = tables.KINDS

# {step: [diagnostics rows of that step, one per seed]} of one run.
History = dict[int, list[dict]]


def diagnostics_by_step(rows: Iterable[dict], last_step: float = math.inf) -> History:
  """The diagnostics rows of a metrics log (those with `max_logit`; the
  validation rows have none) up to `last_step`, by step, in the log's order."""
  out: History = {}
  for row in rows:
    if "max_logit" in row and row["step"] <= last_step:
      out.setdefault(row["step"], []).append(row)
  return out


def run_histories(workdir: workdir_lib.Workdir, cfg: config_lib.ExperimentConfig,
                  last_step: float = math.inf) -> dict[tuple[str, int], History]:
  """`{(arm, d_k): History}` of every run of `cfg` in `workdir` that logged
  diagnostics, arms in the config's order, then dims."""
  out = {}
  for name in cfg.arms:
    for dim in cfg.dims:
      arm = config_lib.Arm.of(name, dim)
      log = metrics_log.MetricsLog(workdir.run(arm).metrics, write=False).read()
      history = diagnostics_by_step(log, last_step)
      if history:
        out[(name, dim)] = history
  return out


def grid_histories(path: str, cfg: config_lib.ExperimentConfig,
                   axes: Sequence[tuple[str, tuple]] = (), last_step: float = math.inf
                   ) -> dict[str, dict[tuple[str, int], History]]:
  """`{point name: run_histories}` of every grid point of `axes` under the
  workdir `path`; without axes one entry, named "", for the workdir itself."""
  workdir = workdir_lib.Workdir(path)
  if not axes:
    return {"": run_histories(workdir, cfg, last_step)}
  return {p.name: run_histories(workdir.point(p), p.config, last_step)
          for p in config_lib.grid(cfg, tuple(axes))}


def _kind_value(row: dict, stat: str, kind: str) -> float:
  """`stat` of `kind` in one row, the largest over its layers (NaN if none)."""
  value = tables.kind_value(row, stat, kind)
  return math.nan if value is None else value


def _mean(values: Sequence[float]) -> float:
  return sum(values) / len(values)


def markdown(runs: dict[tuple[str, int], History]) -> str:
  """The two tables of one workdir's runs (module docstring)."""
  if not runs:
    raise ValueError("`runs` holds no run with diagnostics.")
  first = min(min(steps) for steps in runs.values())
  growth, saturation = [], []
  for (arm, dim), steps in runs.items():
    last = max(steps)
    cells = []
    for kind in KINDS:
      early = _mean([_kind_value(r, "max_logit", kind) for r in steps[first]])
      end = _mean([_kind_value(r, "max_logit", kind) for r in steps[last]])
      sat = _mean([_kind_value(r, "saturated", kind) for r in steps[last]])
      cells.append(f"{early:.1f} → {end:.1f} ({100 * sat:.0f}%)")
    growth.append([f"`{arm}`", dim, last, *cells])
    cells = []
    for kind in KINDS:
      hit = [s for s in sorted(steps)
             if all(_kind_value(r, "saturated", kind) >= HALF for r in steps[s])]
      cells.append(str(hit[0]) if hit else "–")
    saturation.append([f"`{arm}`", dim, *cells])
  return (f"Largest attention logit per kind (the largest over its layers; mean over seeds) "
          f"at step {first} and at the last step; in brackets the share of saturated rows "
          f"(largest weight > 0.99) at the last step.\n\n"
          + tables.markdown(["arm", "d_k", "last step", *KINDS], growth)
          + f"\nFirst diagnostics step at which a kind has ≥ {HALF:.0%} of its rows saturated "
          "in some layer (every seed), or – if never.\n\n"
          + tables.markdown(["arm", "d_k", *KINDS], saturation))


def grid_markdown(points: dict[str, dict[tuple[str, int], History]]) -> str:
  """`markdown` of one workdir, or of every grid point that has runs, each
  under a heading that names the point."""
  if list(points) == [""]:
    return markdown(points[""])
  found = {name: runs for name, runs in points.items() if runs}
  if not found:
    raise ValueError("no grid point holds a run with diagnostics.")
  return "\n".join(f"## {name}\n\n{markdown(runs)}" for name, runs in found.items())
