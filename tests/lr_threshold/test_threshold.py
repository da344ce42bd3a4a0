"""experiments/lr_threshold/threshold.py and experiments/lr_threshold/report.py on
fake grids written to disk in the trainer's layout (Workdir and RunDir name
every path, MetricsLog writes the logs, workdir.check_run the config.json),
with losses made from a known lr*(d_k) law so that every answer is known in
advance."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.lr_threshold import brackets
from experiments.lr_threshold import threshold as th
from experiments.lr_threshold import records as threshold_records
from experiments.lr_threshold import grids
from experiments.lr_threshold import tables as threshold_tables
from attention_jax.sweep import config as config_lib
from attention_jax.sweep import workdir as workdir_lib
from attention_jax import files
from attention_jax.measure import provenance
from attention_jax.training.metrics_log import MetricsLog
from attention_jax.training.metrics_log import rounded
from experiments.lr_threshold import report as threshold_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARGIN = th.FAILURE_MARGIN
MAIN, LRS = grids.preset_grids()["main"]
CONTROLS, CONTROL_LRS = grids.preset_grids()["controls"]
# The law the fake main grid is made from: lr*(d) = C_s d^p_s, and lr_opt(d)
# a grid learning rate below it (none the grid's lowest).
LAW = {"dot": (0.128, -1.0), "scaled_dot": (0.032, -0.5)}
LR_OPT = {("dot", 16): 3e-3, ("dot", 64): 1e-3, ("dot", 256): 3e-4,
          ("scaled_dot", 16): 3e-3, ("scaled_dot", 64): 1e-3, ("scaled_dot", 256): 1e-3}
SEED_OFFSET = (-0.01, 0.01)  # seed 0 a little below the mean, seed 1 above


def lr_star(score, dim):
  c, p = LAW[score]
  return c * dim ** p


def designed_loss(score, dim, lr, best=2.0):
  """L linear in log lr on both sides of lr_opt: below it rising slowly,
  above it reaching best + MARGIN exactly at lr*, so that the log-lr
  interpolation between any two grid points is exact."""
  x, x_opt, x_star = math.log(lr), math.log(LR_OPT[(score, dim)]), math.log(lr_star(score, dim))
  if x <= x_opt:
    return best + 0.05 * (x_opt - x)
  return best + MARGIN * (x - x_opt) / (x_star - x_opt)


def point_of(cfg, lrs, lr):
  return next(p for p in config_lib.grid(cfg, (("learning_rate", tuple(lrs)),))
              if p.values["learning_rate"] == lr)


def diag_row(step, seed, logit):
  """A diagnostics row of the Transformer's kinds, two layers each; the
  second layer of each self kind the larger."""
  row = {"step": step, "seed": seed, "loss": 3.0}
  for kind, scale in (("encoder_self", 1.0), ("decoder_self", 2.0), ("cross", 5.0)):
    for layer in (0, 1):
      row[f"max_logit_{kind}_l{layer}"] = rounded(logit * scale * (1 + layer))
      row[f"saturated_{kind}_l{layer}"] = rounded(0.1 * scale * (1 + layer) / 5)
  return row


def write_run(path, cfg, lrs, score, dim, lr, losses, *, until=None, finished=True,
              diverged_at=None):
  """One run folder as the trainer leaves it: config.json, metrics.jsonl
  (diagnostics every `diag_every`, validation every `eval_every`, up to
  `until`), and, if `finished`, result.json. `losses[seed]` is the final
  validation loss; a seed in `diverged_at` has null perplexities from that
  step on."""
  point = point_of(cfg, lrs, lr)
  arm = config_lib.Arm.of(score, dim)
  run = workdir_lib.Workdir(str(path)).point(point).run(arm)
  os.makedirs(run.path, exist_ok=True)
  # writes config.json
  assert workdir_lib.check_run(run, workdir_lib.fingerprint(point.config, arm)) is None
  steps = cfg.steps
  until = steps if until is None else until
  diverged_at = diverged_at or {}
  log = MetricsLog(run.metrics)
  logit = 10.0 * dim * lr * 100  # grows with d_k and lr, as the heat maps should show
  for step in range(cfg.diag_every, until + 1, cfg.diag_every):
    for seed in range(cfg.seeds):
      log.append(diag_row(step, seed, logit * step / 100))
    if step % cfg.eval_every == 0:
      for seed in range(cfg.seeds):
        bad = seed in diverged_at and step >= diverged_at[seed]
        loss = losses[seed] + 0.5 * (steps - step) / steps
        log.append({"step": step, "seed": seed, "val_bleu": None if bad else 1.0,
                    "val_ppl": None if bad else rounded(math.exp(loss))})
  if finished:
    rows = []
    for seed in range(cfg.seeds):
      bad = seed in diverged_at
      rows.append(provenance.stamp({
          "arm": score, "dim": dim, "seed": seed, "model": "transformer",
          "dataset": cfg.dataset, "params": 1000, "steps": steps, "train_seconds": 1.0,
          "val_bleu": None if bad else 2.0, "best_step": steps,
          "test_bleu": None if bad else 10.0 + seed + 100 * lr,
          "val_ppl": None if bad else rounded(math.exp(losses[seed])),
          "diverged_at_step": diverged_at.get(seed), "diagnostics": diag_row(steps, seed, 1.0)}))
    files.atomic_write(run.result, files.to_json(rows))
  return run


@pytest.fixture(scope="module", autouse=True)
def known_provenance():
  """Result rows stamped with a fixed provenance whose command names an
  absolute folder (which the outputs must not repeat)."""
  fixed = provenance.record(commit="c0ffee", dirty=False,
                            versions={"python": "3.11.7", "jax": "9.9"}, platform="cpu",
                            device_kind="Test CPU", device_count=1, cpu="Test CPU",
                            cpu_cores=2,
                            command="python -m experiments.ablation --workdir=/abs/secret",
                            xla_flags="", date="2026-11-30T00:00:00Z")
  saved = provenance._cached
  provenance._cached = lambda: fixed
  yield fixed
  provenance._cached = saved


def write_main(path, skip=(), partial=()):
  """The main grid of the law: every cell but `skip` (absent) and `partial`
  (trained to step 500, not finished)."""
  for score in MAIN.arms:
    for dim in MAIN.dims:
      for lr in LRS:
        if (score, dim, lr) in skip:
          continue
        mean = designed_loss(score, dim, lr)
        losses = [mean + o for o in SEED_OFFSET]
        if (score, dim, lr) in partial:
          write_run(path, MAIN, LRS, score, dim, lr, losses, until=500, finished=False)
        else:
          write_run(path, MAIN, LRS, score, dim, lr, losses)


@pytest.fixture(scope="module")
def main_grid(tmp_path_factory):
  path = tmp_path_factory.mktemp("grid") / "main"
  write_main(path)
  return path


# --- the pure pieces ----------------------------------------------------------------


def test_interpolation_is_linear_in_log_lr():
  # L reaches 2 + MARGIN halfway (in log lr) between 1e-3 and 3e-3
  t = th.threshold([(1e-4, 2.2), (1e-3, 2.0), (3e-3, 2.0 + 2 * MARGIN), (1e-2, 9.0)],
                   (1e-4, 1e-3, 3e-3, 1e-2))
  assert t.lr_opt == 1e-3 and t.loss_opt == 2.0
  assert t.lr_star == pytest.approx(math.sqrt(1e-3 * 3e-3), rel=1e-12)
  assert t.fitted and not t.censored
  # a later point first crossing: interpolated from the last point below the target
  t = th.threshold([(1e-3, 2.0), (3e-3, 2.0 + MARGIN / 2), (1e-2, 2.0 + 3 * MARGIN / 2)],
                   (1e-4, 1e-3, 3e-3, 1e-2))
  assert t.lr_star == pytest.approx(math.exp(math.log(3e-3) + 0.5 * math.log(1e-2 / 3e-3)))
  assert not t.complete and not t.fitted  # 1e-4 is planned but not known: provisional


def test_reaching_the_target_exactly_at_a_grid_point_gives_that_point():
  t = th.threshold([(1e-3, 2.0), (3e-3, 2.0 + MARGIN)], (1e-3, 3e-3, 1e-2))
  assert t.lr_star == pytest.approx(3e-3)


def test_censoring_flags():
  planned = (1e-4, 1e-3, 1e-2)
  above = th.threshold([(1e-4, 3.0), (1e-3, 2.0), (1e-2, 2.0 + MARGIN / 2)], planned)
  assert above.lr_star is None and above.above and above.censored and not above.fitted
  lowest = th.threshold([(1e-4, 2.0), (1e-3, 2.0 + 2 * MARGIN), (1e-2, 5.0)], planned)
  assert lowest.lowest and lowest.censored and not lowest.fitted
  assert lowest.lr_star == pytest.approx(math.sqrt(1e-4 * 1e-3))  # reported all the same
  top = th.threshold([(1e-4, 3.0), (1e-3, 2.5), (1e-2, 2.0)], planned)
  assert top.lr_opt == 1e-2 and top.above and top.lr_star is None
  nowhere = th.threshold([(lr, math.inf) for lr in planned], planned)
  assert nowhere.nowhere and nowhere.lr_opt is None and not nowhere.fitted


def test_a_diverged_point_past_the_optimum_puts_lr_star_at_the_last_point_below_target():
  planned = (1e-4, 1e-3, 1e-2)
  t = th.threshold([(1e-4, 2.1), (1e-3, 2.0), (1e-2, math.inf)], planned)
  assert t.lr_star == 1e-3 and t.into_divergence and t.fitted
  # a diverged point below the optimum plays no part
  t = th.threshold([(1e-4, math.inf), (1e-3, 2.0), (1e-2, 2.0 + 2 * MARGIN)], planned)
  assert t.lr_opt == 1e-3 and not t.lowest and not t.into_divergence


def test_a_tie_at_the_minimum_takes_the_lower_learning_rate():
  t = th.threshold([(1e-4, 2.5), (1e-3, 2.0), (3e-3, 2.0), (1e-2, 2.0 + 2 * MARGIN)],
                   (1e-4, 1e-3, 3e-3, 1e-2))
  assert t.lr_opt == 1e-3
  # L climbs from 2.0 at 3e-3 (below the target) to 2 + 2 MARGIN at 1e-2
  assert t.lr_star == pytest.approx(math.sqrt(3e-3 * 1e-2))


def test_sensitivity_by_hand():
  ln_v = math.log(2000)
  # mean(min(L, ln V)) - min L = (2.0 + 2.5 + ln V + ln V) / 4 - 2.0
  assert th.sensitivity([2.0, 2.5, math.inf, 9.0], ln_v) == pytest.approx(
      (2.0 + 2.5 + 2 * ln_v) / 4 - 2.0)
  assert th.sensitivity([3.0, 3.0], ln_v) == 0.0
  assert th.sensitivity([math.inf, math.inf], ln_v) is None
  assert th.sensitivity([3.0], ln_v) is None  # one learning rate has no spread


def test_absolute_failures_compare_with_the_best_of_every_score_at_the_same_d_k():
  c = grids.Cell
  losses = {c("a", 16, 1e-3): 2.0, c("b", 16, 1e-3): 2.0 + MARGIN * 0.9,
            c("b", 16, 1e-2): 2.0 + MARGIN * 1.1, c("a", 16, 1e-2): math.inf,
            c("a", 64, 1e-3): 5.0}  # another d_k: its own best
  fails, best = th.absolute_failures(losses)
  assert best == {16: 2.0, 64: 5.0}
  assert fails == {c("a", 16, 1e-3): False, c("b", 16, 1e-3): False, c("b", 16, 1e-2): True,
                   c("a", 16, 1e-2): True, c("a", 64, 1e-3): False}
  # a d_k where every cell diverged: every cell fails
  fails, _ = th.absolute_failures({c("a", 16, 1e-3): math.inf})
  assert fails == {c("a", 16, 1e-3): True}


def test_slope_recovers_a_power_law():
  for p in (-1.0, -0.5, 0.0, 0.7):
    assert th.slope([(d, 3e-2 * d ** p) for d in (16, 64, 256)]) == pytest.approx(p)
  assert th.slope([(16, 1e-3)]) is None
  assert th.slope([(16, 1e-3), (16, 2e-3)]) is None


def test_bootstrap_of_identical_seeds_is_the_point_estimate_and_repeats():
  planned = (1e-4, 1e-3, 1e-2)
  losses = {}
  for d, lr_s in ((16, 4e-3), (64, 1e-3), (256, 2.5e-4)):
    for lr in planned:
      base = 2.0 if lr <= 1e-4 else (2.0 + 3 * MARGIN)  # lr* set only by interpolation
      losses[(d, lr)] = np.array([base, base])
  one = th.bootstrap_slope(losses, planned, replicates=50)
  assert one.with_slope == 0  # lr_opt is the grid's lowest at every d_k: all censored
  losses = {(d, lr): np.full(2, v) for d in (16, 64, 256) for lr, v in
            zip(planned, (2.3, 2.0, 2.0 + MARGIN * (2.0 if d == 16 else 4.0 if d == 64 else 8.0)))}
  b = th.bootstrap_slope(losses, planned, replicates=50)
  point = th.slope(th.fit_points({d: th.threshold([(lr, losses[(d, lr)][0]) for lr in planned],
                                                  planned) for d in (16, 64, 256)}))
  assert b.with_slope == 50 and b.low == pytest.approx(point) and b.high == pytest.approx(point)
  assert th.bootstrap_slope(losses, planned, replicates=50) == b


# --- reading a grid from disk ---------------------------------------------------------


def test_the_fitted_slopes_recover_the_law_the_losses_were_made_from(main_grid):
  grid = grids.read_grid(str(main_grid), MAIN, LRS)
  assert grid.missing == ()
  assert len(grid.records) == len(MAIN.arms) * len(MAIN.dims) * len(LRS) * MAIN.seeds
  a = th.analyse(grid)
  for score, (_, p) in LAW.items():
    for dim in MAIN.dims:
      t = a.thresholds[(score, dim)]
      assert t.lr_opt == LR_OPT[(score, dim)] and t.fitted
      # val_ppl is logged to 6 significant digits: ln of it to ~1e-6
      assert t.lr_star == pytest.approx(lr_star(score, dim), rel=1e-4)
    law = a.laws[score]
    assert law.slope == pytest.approx(p, abs=1e-4) and law.dims == (16, 64, 256)
    assert law.reference == p
    # each cell's two seeds are the mean -+0.01: the interval holds the slope, and is
    # not a point (the draws move lr*)
    assert law.interval.low <= law.slope <= law.interval.high
    assert law.interval.low < law.interval.high
    assert law.interval.with_slope == th.BOOTSTRAP_REPLICATES


def test_records_hold_the_last_validation_loss_bleu_and_diagnostics(main_grid):
  grid = grids.read_grid(str(main_grid), MAIN, LRS)
  r = next(r for r in grid.records if r.cell == grids.Cell("dot", 64, 1e-3) and r.seed == 1)
  assert r.loss == pytest.approx(designed_loss("dot", 64, 1e-3) + SEED_OFFSET[1], abs=1e-5)
  assert r.test_bleu == pytest.approx(10.0 + 1 + 0.1)
  logit = 10.0 * 64 * 1e-3 * 100
  # step 100: the largest over layers (l1, twice l0), decoder self twice encoder self
  assert r.diagnostics["max_logit_encoder_self_step100"] == pytest.approx(2 * logit)
  assert r.diagnostics["max_logit_decoder_self_step100"] == pytest.approx(4 * logit)
  assert r.diagnostics["max_logit_self_step100"] == pytest.approx(4 * logit)  # cross left out
  assert r.diagnostics["max_logit_self_last"] == pytest.approx(4 * logit * 10)
  assert r.diagnostics["saturated_decoder_self_last"] == pytest.approx(0.08)
  assert r.provenance["commit"] == "c0ffee" and "command" not in r.provenance


def test_a_partial_grid_is_analysed_and_names_its_missing_cells(tmp_path):
  skip = {("dot", 256, lr) for lr in LRS[3:]}  # not started
  partial = {("scaled_dot", 16, 1e-2)}  # trained to step 500 only
  write_main(tmp_path / "main", skip=skip, partial=partial)
  # both seeds diverged in a run still going: known (they cannot recover)
  write_run(tmp_path / "main", MAIN, LRS, "dot", 256, 1e-3, [2.0, 2.0], until=500,
            finished=False, diverged_at={0: 500, 1: 250})
  # one seed diverged, the other not yet at its last step: not known
  write_run(tmp_path / "main", MAIN, LRS, "dot", 256, 3e-3, [2.0, 2.0], until=500,
            finished=False, diverged_at={1: 250})
  grid = grids.read_grid(str(tmp_path / "main"), MAIN, LRS)
  missing = {grids.Cell(*c) for c in (skip - {("dot", 256, 1e-3)}) | partial}
  assert set(grid.missing) == missing
  a = th.analyse(grid)
  assert a.losses[grids.Cell("dot", 256, 1e-3)] == math.inf
  t = a.thresholds[("dot", 256)]
  assert not t.complete and not t.fitted and t.into_divergence  # 3e-4 then diverged
  assert a.thresholds[("scaled_dot", 16)].complete is False
  # dot is fitted on its two complete d_k, still the law's slope
  assert a.laws["dot"].dims == (16, 64)
  assert a.laws["dot"].slope == pytest.approx(-1.0, abs=1e-4)
  assert a.laws["scaled_dot"].dims == (64, 256)
  text = threshold_tables.markdown(a)
  assert "## Cells not yet known" in text
  assert "| dot | 256 | 3e-3, 1e-2 |" in text
  assert "| scaled_dot | 16 | 1e-2 |" in text
  # 1e-3 is below dot's lr_opt at d_k 16 (3e-3): 2 + 0.05 ln 3
  assert "| dot | 1e-3 | 2.055 | 2.000 | diverged (2 of 2 seeds) |" in text


def test_a_finished_run_with_a_diverged_seed_counts_as_failed(tmp_path):
  write_run(tmp_path / "w", MAIN, LRS, "dot", 16, 1e-2, [2.0, 2.0], diverged_at={0: 500})
  grid = grids.read_grid(str(tmp_path / "w"), MAIN, LRS)
  (r0, r1) = sorted((r for r in grid.records), key=lambda r: r.seed)
  assert r0.diverged and r0.loss == math.inf and r0.test_bleu is None
  assert not r1.diverged and r1.loss == pytest.approx(2.0, abs=1e-5)
  assert th.analyse(grid, replicates=10).losses == {grids.Cell("dot", 16, 1e-2): math.inf}


def test_a_run_of_other_settings_is_refused_naming_its_config(tmp_path):
  run = write_run(tmp_path / "w", MAIN, LRS, "dot", 16, 1e-3, [2.0, 2.0])
  old = files.read_json(run.config)
  files.atomic_write(run.config, files.to_json({**old, "dropout": 0.3}))
  with pytest.raises(ValueError, match="dropout"):
    grids.read_grid(str(tmp_path / "w"), MAIN, LRS)


def test_the_controls_join_the_main_grid(main_grid, tmp_path):
  for score in CONTROLS.arms:
    for dim in CONTROLS.dims:
      for lr in CONTROL_LRS:
        loss = {1e-4: 2.0, 1e-3: 1.9, 1e-2: 2.9}[lr]
        write_run(tmp_path / "controls", CONTROLS, CONTROL_LRS, score, dim, lr, [loss, loss])
  grid = grids.merge([grids.read_grid(str(main_grid), MAIN, LRS),
                   grids.read_grid(str(tmp_path / "controls"), CONTROLS, CONTROL_LRS)])
  assert grid.scores == ("dot", "scaled_dot", "inverse_dim", "qk_norm")
  a = th.analyse(grid, replicates=20)
  assert a.best[16] == pytest.approx(1.9, abs=1e-5)  # L_best over every score
  # the main grid's best (2.0) is within ln 1.2 of the controls' 1.9: passes
  assert not a.fails[grids.Cell("dot", 16, 3e-3)]
  # the controls' lr* lies between 1e-3 and 1e-2 at every d_k: slope 0, as flat as made
  assert a.laws["qk_norm"].slope == pytest.approx(0.0, abs=1e-9)
  t = a.thresholds[("qk_norm", 64)]
  assert t.lr_opt == 1e-3 and t.lr_star == pytest.approx(1e-3 * 10 ** MARGIN, rel=1e-5)
  assert a.sensitivity[("qk_norm", 64)] == pytest.approx((2.0 + 1.9 + 2.9) / 3 - 1.9, abs=1e-5)
  # beside the rule: every score again on the three rates they all ran
  assert th.shared_rates(grid) == tuple(sorted(CONTROL_LRS))
  shared = a.shared
  assert shared is not None and shared.shared is None
  assert {c.lr for c in shared.losses} == set(CONTROL_LRS)
  assert all(v == tuple(sorted(CONTROL_LRS)) for v in shared.grid.learning_rates.values())
  assert shared.sensitivity[("qk_norm", 64)] == a.sensitivity[("qk_norm", 64)]
  on_three = [designed_loss("dot", 64, lr) for lr in sorted(CONTROL_LRS)]
  assert shared.sensitivity[("dot", 64)] == pytest.approx(
      np.mean(on_three) - min(on_three), abs=1e-4)
  assert shared.sensitivity[("dot", 64)] != pytest.approx(a.sensitivity[("dot", 64)], abs=1e-3)
  text = threshold_tables.markdown(a)
  assert "## Learning-rate sensitivity on the learning rates every score ran (1e-4, 1e-3, 1e-2;" in text
  assert threshold_records.as_json(a)["shared_rates"]["learning_rates"] == sorted(CONTROL_LRS)
  # one plan for every score: nothing to repeat
  assert th.analyse(grids.read_grid(str(main_grid), MAIN, LRS), replicates=10).shared is None
  with pytest.raises(ValueError, match="two grids"):
    grids.merge([grid, grids.read_grid(str(main_grid), MAIN, LRS)])


def test_curves_keep_a_colour_per_dk_and_one_scale_per_row(main_grid, tmp_path):
  """The controls here lack d_k 16: their panels must keep the main grid's
  colour for d_k 64 and 256, and every panel of a row its y and x range."""
  import matplotlib.pyplot as plt
  from experiments.lr_threshold import plots as threshold_plots
  for score in CONTROLS.arms:
    for dim in (64, 256):
      for lr in CONTROL_LRS:
        write_run(tmp_path / "controls", CONTROLS, CONTROL_LRS, score, dim, lr, [2.5, 2.5])
  grid = grids.merge([grids.read_grid(str(main_grid), MAIN, LRS),
                   grids.read_grid(str(tmp_path / "controls"), CONTROLS, CONTROL_LRS)])
  fig = threshold_plots.curves_figure(th.analyse(grid, replicates=10))
  try:
    axes = fig.axes
    top = [ax for ax in axes if ax.get_title()]
    assert [ax.get_title() for ax in top] == ["dot", "scaled_dot", "inverse_dim", "qk_norm"]
    colour = {}
    for ax in axes:
      for line in ax.get_lines():
        if line.get_label().startswith("d_k"):
          assert colour.setdefault(line.get_label(), line.get_color()) == line.get_color()
    assert len(set(colour.values())) == 3
    assert len({ax.get_ylim() for ax in top}) == 1
    assert len({ax.get_xlim() for ax in axes}) == 1
  finally:
    plt.close(fig)


def test_heat_map_cells_show_small_logits_with_two_digits():
  from experiments.lr_threshold import plots as threshold_plots
  assert threshold_plots.cell_label(0.14) == "0.14"
  assert threshold_plots.cell_label(2.36) == "2.4"
  assert threshold_plots.cell_label(314507.0) == "314,507"
  assert threshold_plots.cell_label(float("nan")) == "–"


def test_run_clocks_count_each_run_once(main_grid):
  grid = grids.read_grid(str(main_grid), MAIN, LRS)
  runs = len(MAIN.dims) * len(LRS)
  assert threshold_records.run_clocks(grid.records) == {
      "dot": {"runs": runs, "hours": pytest.approx(runs / 3600)},
      "scaled_dot": {"runs": runs, "hours": pytest.approx(runs / 3600)}}
  record = lambda seed, seconds, lr=1e-3: grids.Record("dot", 16, lr, seed, 2.0, False, 1.0, {},
                                                   None, seconds)
  assert threshold_records.run_clocks(
      [record(0, 10.0), record(1, 20.0), record(0, None, 3e-3)]) == {
      "dot": {"runs": 1, "hours": pytest.approx(20 / 3600)}}
  text = threshold_tables.markdown(th.analyse(grid, replicates=10))
  assert f"| all | {2 * runs} | 0.0 |" in text
  # the written rows' test BLEU, 10 + seed + 100 lr, seed by seed
  assert "| 16 | dot | 10.0 / 11.0 | 10.0 / 11.0 | 10.0 / 11.0 | 10.1 / 11.1 | 10.3 / 11.3 |" in text


# --- the driver -------------------------------------------------------------------------


def test_the_driver_writes_every_output_without_machine_paths(main_grid, tmp_path,
                                                             tmp_path_factory):
  out = tmp_path / "report"
  analysis, inputs = threshold_report.read(str(main_grid), "")
  written = threshold_report.write(analysis, inputs, str(out))
  assert sorted(written) == sorted(os.listdir(out))
  assert {"lr_threshold.md", "lr_threshold.json", "lr_curves.png", "max_logit_heatmaps.png",
          "lr_star.png"} == set(written)
  for name in written:
    with open(out / name, "rb") as f:
      data = f.read()
    assert str(tmp_path_factory.getbasetemp()).encode() not in data, name
    assert b"/abs/secret" not in data, name
  value = json.loads((out / "lr_threshold.json").read_text())
  assert value["inputs"] == {"main": os.path.relpath(main_grid, out)}
  laws = {law["score"]: law for law in value["laws"]}
  assert laws["dot"]["slope"] == pytest.approx(-1.0, abs=1e-4)
  # lr* 8e-3, 2e-3, 5e-4 in (3e-3, 1e-2], (1e-3, 3e-3], (3e-4, 1e-3]: slopes from
  # log(3e-4 / 1e-2) / log 16 to log(1e-3 / 3e-3) / log 16, containing -1.
  assert laws["dot"]["bracket"] == pytest.approx([math.log(3e-2) / math.log(16),
                                                  math.log(1 / 3) / math.log(16)])
  assert laws["dot"]["verdict"] == brackets.UNRESOLVED and laws["dot"]["band"] is None
  assert value["provenance"] == [{"commit": "c0ffee", "dirty": False,
                                  "versions": {"python": "3.11.7", "jax": "9.9"},
                                  "platform": "cpu", "device_kind": "Test CPU", "xla_flags": "",
                                  "rows": len(value["records"])}]
  assert len(value["cells"]) == 36 and value["missing"] == []
  text = (out / "lr_threshold.md").read_text()
  assert "| dot | 64 | 1e-3 | 2.000 | (1e-3, 3e-3] | 2e-3 | fitted |" in text


def test_a_report_kept_in_a_clean_checkout_is_not_called_dirty(main_grid, tmp_path,
                                                                monkeypatch):
  """The report's own files, replaced in a clean tree, must not mark it dirty."""
  repo = tmp_path / "repo"
  out = repo / "results" / "grid"
  out.mkdir(parents=True)
  (out / "lr_threshold.md").write_text("an older report\n")
  git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True,
                                  capture_output=True, text=True).stdout.strip()
  git("init", "-q")
  git("-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "older report")
  monkeypatch.setattr(threshold_report, "ROOT", str(repo))
  analysis, inputs = threshold_report.read(str(main_grid), "")
  threshold_report.write(analysis, inputs, str(out))
  value = json.loads((out / "lr_threshold.json").read_text())
  made = value["analysed_at"]  # the analysis's provenance, in the one schema
  assert (made["commit"], made["dirty"]) == (git("rev-parse", "HEAD"), False)
  assert provenance.problems(made) == []


@pytest.mark.parametrize("args, named", [
    (dict(main=None, controls="", out="o"), "--main is required"),
    (dict(main="M", controls="", out=None), "--out is required"),
    (dict(main="nowhere", controls="", out="o"), "--main: no folder"),
    (dict(main="M", controls="nowhere", out="o"), "--controls: no folder"),
    (dict(main="M", controls="", out="F"), "--out: "),
])
def test_bad_paths_are_one_line_naming_the_flag(tmp_path, args, named):
  (tmp_path / "M").mkdir()
  (tmp_path / "F").write_text("a file")
  paths = {k: (str(tmp_path / v) if v else v) for k, v in args.items()}
  problem = threshold_report.path_problem(paths["main"], paths["controls"], paths["out"])
  assert problem is not None and problem.startswith(named) and "\n" not in problem


def test_a_workdir_of_the_other_grid_is_refused_naming_the_flag(main_grid):
  with pytest.raises(ValueError, match="^--controls: .* holds no run of the grid"):
    threshold_report.read(str(main_grid), str(main_grid))


def test_the_command_line_refuses_a_bad_path_before_any_work(tmp_path):
  p = subprocess.run([sys.executable, "-m", "experiments.lr_threshold.report",
                      f"--main={tmp_path / 'absent'}", f"--out={tmp_path / 'out'}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert p.returncode != 0
  assert p.stderr.strip().splitlines()[-1].startswith("error: --main: no folder")
  assert not (tmp_path / "out").exists()


def test_a_report_of_the_same_runs_keeps_the_one_in_place_and_its_commit(main_grid, tmp_path,
                                                                          monkeypatch):
  """Written again from the same runs at a later commit, the report in --out
  is left as it is (the commit it names included); a changed number, or a
  file of it gone, writes the new one."""
  out = tmp_path / "report"
  analysis, inputs = threshold_report.read(str(main_grid), "")
  commits = iter(["aaaaaaa1", "bbbbbbb2", "ccccccc3", "ddddddd4", "eeeeeee5"])
  monkeypatch.setattr(provenance, "git_state", lambda root: (next(commits), False))
  assert threshold_report.write(analysis, inputs, str(out))
  before = {name: (out / name).read_bytes() for name in os.listdir(out)}
  said = []
  assert threshold_report.write(analysis, inputs, str(out), log=said.append) == []
  assert said == [f"{out}: the report there has the same numbers, tables and figures; "
                  "kept as analysed at aaaaaaa"]
  assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
  # A figure gone: written again, whole, at the new commit.
  (out / "lr_star.png").unlink()
  assert "lr_star.png" in threshold_report.write(analysis, inputs, str(out))
  assert json.loads((out / "lr_threshold.json").read_text())["analysed_at"]["commit"] == "ccccccc3"
  # A number changed (a cell's loss): written.
  value = json.loads((out / "lr_threshold.json").read_text())
  value["cells"][0]["L"] += 1.0
  (out / "lr_threshold.json").write_text(json.dumps(value))
  assert threshold_report.write(analysis, inputs, str(out))
  assert json.loads((out / "lr_threshold.json").read_text())["analysed_at"]["commit"] == "ddddddd4"
  # One made from a dirty checkout gives way to the clean one.
  value = json.loads((out / "lr_threshold.json").read_text())
  value["analysed_at"]["dirty"] = True
  (out / "lr_threshold.json").write_text(json.dumps(value))
  assert threshold_report.write(analysis, inputs, str(out))
  made = json.loads((out / "lr_threshold.json").read_text())["analysed_at"]
  assert (made["commit"], made["dirty"]) == ("eeeeeee5", False)
