"""The adaptive grid of `transformer_lr_premise_cpu`: the rule that names its
next runs (`threshold.plan_next`), the attention rule (`cell_saturates`,
`attention_threshold`), and its workdir read as one grid (`read_premise`)
and planned from the command line (`threshold_report --plan`)."""

import math
import os
import subprocess
import sys

import pytest

from experiments.lr_threshold import adaptive
from experiments.lr_threshold import brackets
from experiments.lr_threshold import threshold as th
from experiments.lr_threshold import grids
from experiments.lr_threshold import report
from attention_jax.sweep import config as config_lib
from experiments.lr_threshold.presets import transformer_lr_premise_cpu as premise
from tests.lr_threshold.test_threshold import write_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARGIN = th.FAILURE_MARGIN
COARSE = premise.COARSE_RATES  # 1e-4, 3.2e-4, 1e-3, 3.2e-3, 1e-2, 3.2e-2
CFG = config_lib.from_preset("transformer_lr_premise_cpu")


def test_the_preset_is_the_lr_cpu_recipe_with_pre_ln_and_the_premise_init():
  lr_cpu = config_lib.from_preset("transformer_lr_cpu")
  changed = {k for k, v in CFG.to_dict().items() if lr_cpu.to_dict()[k] != v}
  assert changed == {"arms", "layer_norm", "qk_init"}
  assert (CFG.layer_norm, CFG.qk_init, CFG.arms) == ("pre", "premise",
                                                     ("dot", "scaled_dot", "inverse_dim"))
  # The ladder is a quarter-decade apart, each rate two significant digits.
  ratios = [b / a for a, b in zip(premise.LADDER, premise.LADDER[1:])]
  assert all(abs(math.log10(r) - 0.25) < 0.02 for r in ratios)
  # The bands: the prediction +- 1/4.
  for score, (low, high) in premise.BANDS.items():
    assert (low + high) / 2 == pytest.approx(th.REFERENCE_SLOPES[score])
    assert high - low == pytest.approx(0.5)


def _records(score, dim, losses, saturated=(), diverged=()):
  """Two identical seeds per rate; `saturated`: the rates whose self attention
  saturates (share 0.9; else 0.1)."""
  out = []
  for lr, loss in losses.items():
    for seed in (0, 1):
      bad = lr in diverged
      out.append(grids.Record(score, dim, lr, seed, math.inf if bad else loss, bad, None,
                           {th.SATURATION_KEY: 0.9 if lr in saturated else 0.1}))
  return out


def _analysis(curves):
  """curves: {(score, dim): (losses {lr: L}, saturated rates)}."""
  records, rates = [], {}
  for (score, dim), (losses, saturated) in curves.items():
    records += _records(score, dim, losses, saturated)
    rates[(score, dim)] = tuple(sorted(losses))
  scores = tuple(dict.fromkeys(s for s, _ in curves))
  grid = grids.Grid(tuple(records), (), {s: tuple(sorted({lr for (t, _), v in rates.items()
                                                         if t == s for lr in v}))
                                      for s in scores},
                 {s: tuple(sorted(d for t, d in rates if t == s)) for s in scores},
                 2000, 1000, rates)
  return th.analyse(grid, replicates=10, bands=premise.BANDS)


def _rising(opt, star, rates=COARSE):
  """L: 2.0 at `opt`, 0.05 a decade more below it, reaching the target between
  the rates around `star` (above it by 2 margins)."""
  return {lr: (2.0 + 0.05 * math.log10(opt / lr) if lr <= opt else
               2.0 + (MARGIN / 2 if lr < star else 2 * MARGIN)) for lr in rates}


def test_the_rule_extends_first_then_refines_to_one_ladder_step():
  a = _analysis({
      ("dot", 16): ({**_rising(1e-4, 1e-3), 1e-4: 2.0}, ()),   # lr_opt the lowest
      ("scaled_dot", 16): (_rising(1e-3, 3.2e-3), ()),       # lr* in (1e-3, 3.2e-3]
      # lr_opt 1e-3 (the lowest of the tie), never failing: above
      ("inverse_dim", 16): ({lr: 2.0 + 0.1 * (lr < 1e-3) for lr in COARSE}, ()),
      # lr* in (3.2e-3, 1e-2], lr_att in (1e-3, 3.2e-3]
      ("inverse_dim", 64): (_rising(1e-3, 1e-2), (3.2e-3, 1e-2, 3.2e-2)),
  })
  assert a.thresholds[("dot", 16)].lowest and a.thresholds[("inverse_dim", 16)].above
  assert a.thresholds[("inverse_dim", 64)].bracket == (3.2e-3, 1e-2)
  assert a.attention[("inverse_dim", 64)].bracket == (1e-3, 3.2e-3)
  plan = adaptive.plan_next(a)
  assert plan == {("dot", 16): (3.2e-5,),        # a half-decade below (stage 2)
                  ("scaled_dot", 16): (1.8e-3,),  # the middle of (1e-3, 3.2e-3] (stage 3)
                  ("inverse_dim", 16): (1e-1,),   # a half-decade above, to the ceiling
                  ("inverse_dim", 64): (1.8e-3, 5.6e-3)}  # lr* and lr_att, each its middle
  # Refined: a quarter-decade interval asks for nothing more.
  done = _analysis({("scaled_dot", 16): (_rising(1e-3, 1.8e-3, COARSE + (1.8e-3,)), ())})
  assert done.thresholds[("scaled_dot", 16)].bracket == (1e-3, 1.8e-3)
  assert adaptive.plan_next(done) == {}
  # At the floor and the ceiling the extension stops.
  edge = _analysis({("dot", 16): ({1e-5: 2.0, 1e-4: 2.0 + 2 * MARGIN}, ()),
                    ("dot", 64): ({3.2e-2: 2.1, 1e-1: 2.0}, ())})
  assert edge.thresholds[("dot", 16)].lowest and edge.thresholds[("dot", 64)].above
  assert adaptive.plan_next(edge) == {("dot", 16): (3.2e-5,)}  # refines (1e-5, 1e-4] instead


def test_a_curve_with_a_rate_not_yet_known_asks_for_nothing():
  a = _analysis({("scaled_dot", 16): (_rising(1e-3, 3.2e-3), ())})
  g = a.grid
  partial = grids.Grid(tuple(r for r in g.records if r.lr != 3.2e-2),
                    (grids.Cell("scaled_dot", 16, 3.2e-2),), g.learning_rates, g.dims,
                    g.vocab_size, g.steps, g.cell_rates)
  assert adaptive.plan_next(th.analyse(partial, replicates=10)) == {}


def test_an_interrupted_run_of_the_rule_is_planned_again_and_a_coarse_one_is_left_to_its_sweep(
    tmp_path):
  root = tmp_path / "premise"
  for score in CFG.arms:
    for dim in CFG.dims:
      for lr in COARSE:
        mean = _rising(1e-3, 3.2e-3)[lr]
        # (inverse_dim, 16) at 3.2e-2: a coarse run cut short.
        unfinished = (score, dim, lr) == ("inverse_dim", 16, 3.2e-2)
        write_run(root / grids.COARSE, CFG, COARSE, score, dim, lr, [mean, mean],
                  until=500 if unfinished else None, finished=not unfinished)
  # The rule's run of (scaled_dot, 256) at 1.8e-3 killed at step 500; (dot, 64)'s finished.
  for score, dim, finished in (("scaled_dot", 256, False), ("dot", 64, True)):
    write_run(root / grids.EXTRA / grids.extra_name(score, dim),
              CFG.replace(arms=(score,), dims=(dim,)), (1.8e-3,), score, dim, 1.8e-3,
              [2.0 + MARGIN / 4] * 2, until=None if finished else 500, finished=finished)
  a = th.analyse(grids.read_premise(str(root), CFG), replicates=10, bands=premise.BANDS)
  assert adaptive.unfinished(a) == {("scaled_dot", 256): (1.8e-3,), ("inverse_dim", 16): (3.2e-2,)}
  assert ("scaled_dot", 256) not in adaptive.plan_next(a)
  lines = report.plan_lines(a)
  # Resumed with its rate; the rule's new rates for the other curves as before.
  assert "scaled_dot 256 0.0018" in lines and "dot 16 0.0018" in lines
  assert not any(line.startswith(("dot 64", "inverse_dim 16")) for line in lines)
  assert len(lines) == 7  # the eight of a finished coarse grid, less (dot, 64) and (inverse_dim, 16)


def test_the_attention_rule():
  # Mean over seeds above one half; a diverged seed counts as saturated.
  rec = lambda share, diverged=False: grids.Record("dot", 16, 1e-3, 0, math.inf if diverged else 2.0,
                                                diverged, None, {th.SATURATION_KEY: share})
  assert th.cell_saturates([rec(0.6), rec(0.5)]) is True
  assert th.cell_saturates([rec(0.5), rec(0.5)]) is False
  assert th.cell_saturates([rec(0.1), rec(None, diverged=True)]) is True
  assert th.cell_saturates([rec(0.9), rec(None)]) is None
  planned = (1e-4, 1e-3, 1e-2)
  assert th.attention_threshold([(1e-4, False), (1e-3, True), (1e-2, True)], planned) == \
      th.AttentionThreshold(1e-3, (1e-4, 1e-3))
  below = th.attention_threshold([(1e-4, True), (1e-3, True), (1e-2, True)], planned)
  assert below.below and below.bracket == (None, 1e-4) and not below.fitted
  above = th.attention_threshold([(lr, False) for lr in planned], planned)
  assert above.above and above.bracket == (1e-2, None)
  # Censored cells enter the slope bracket open on their side: in (1e-4, 1e-3] at
  # 16 and <= 1e-4 at 256 allow any slope down to -inf, and up to
  # log(1e-4 / 1e-4) / log 16 = 0.
  low, high = brackets.slope_bracket([(16, 1e-4, 1e-3), (256, 0.0, 1e-4)])
  assert low == -math.inf and high == pytest.approx(0.0, abs=1e-12)
  assert brackets.slope_bracket([(16, 1e-4, 1e-3), (256, 1e-2, math.inf)])[1] == math.inf


def test_the_premise_workdir_reads_as_one_grid_and_plans_from_the_command_line(tmp_path):
  root = tmp_path / "premise"
  for score in CFG.arms:
    for dim in CFG.dims:
      for lr in COARSE:
        mean = _rising(1e-3, 3.2e-3)[lr]
        write_run(root / grids.COARSE, CFG, COARSE, score, dim, lr, [mean, mean])
  # One refinement already run for (dot, 64): its workdir of extra rates.
  extra = (1.8e-3,)
  write_run(root / grids.EXTRA / grids.extra_name("dot", 64), CFG.replace(arms=("dot",), dims=(64,)),
            extra, "dot", 64, 1.8e-3, [2.0 + MARGIN / 4] * 2)
  grid = grids.read_premise(str(root), CFG)
  assert grid.missing == () and grid.planned("dot", 64) == tuple(sorted(COARSE + extra))
  assert grid.planned("dot", 16) == COARSE
  a = th.analyse(grid, replicates=10, bands=premise.BANDS)
  assert a.thresholds[("dot", 64)].bracket == (1.8e-3, 3.2e-3)
  plan = adaptive.plan_next(a)
  assert ("dot", 64) not in plan and plan[("dot", 16)] == (1.8e-3,)
  out = subprocess.run(
      [sys.executable, "-m", "experiments.lr_threshold.report",
       "--preset=transformer_lr_premise_cpu", f"--main={root}", "--plan"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.split("\n")
  assert "dot 16 0.0018" in lines and "scaled_dot 256 0.0018" in lines
  assert not any(line.startswith("dot 64") for line in lines)
  assert len([line for line in lines if line]) == 8
  # A folder under extra/ that names no (score, d_k) of the plan is one line naming it.
  os.makedirs(root / grids.EXTRA / "dot_d999")
  with pytest.raises(ValueError, match="dot_d999"):
    grids.read_premise(str(root), CFG)
