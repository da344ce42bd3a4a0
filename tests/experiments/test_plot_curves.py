"""`experiments.plot_curves` on a run of member values (`--members`): a curve
per learning rate (or the one `--member` names), each the mean over seeds,
and the figure says so; a run of seeds only is one curve, as before."""

import json

from attention_jax.analysis import plots
from attention_jax.training.metrics_log import MetricsLog

RATES = (1e-3, 3e-3)


def _members_log(path):
  """A members run's metrics.jsonl: rates outer, seeds inner, as the trainer
  writes it; validation BLEU 10 x rate index + seed + step / 60, so that each
  rate's mean over seeds differs from the mean over every member."""
  lines = []
  for r, lr in enumerate(RATES):
    for seed in (0, 1):
      for step in (60, 120):
        lines.append({"step": step, "seed": seed, "learning_rate": lr, "loss": 3.0 - r,
                      "val_bleu": 10.0 * r + seed + step / 60, "val_ppl": 5.0 + r})
  path.write_text("".join(json.dumps(line) + "\n" for line in lines))
  return str(path)


def _drawn(monkeypatch, histories, member=None):
  """The lines `plot_validation` draws of `member_curves(histories)`:
  {label: (steps, BLEU)} of the BLEU panel, and the figure's title."""
  figures = []
  monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
  curves = plots.member_curves(histories, member)
  plots.plot_validation(curves, list(curves), "unused.png", note=plots.seeds_note(curves))
  (fig,) = figures
  bleu = fig.axes[0]
  return ({line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
           for line in bleu.get_lines()}, fig._suptitle.get_text())


def test_a_members_run_draws_a_curve_per_rate_each_the_mean_over_its_seeds(tmp_path,
                                                                          monkeypatch):
  rows = MetricsLog(_members_log(tmp_path / "metrics.jsonl"), write=False).read()
  lines, title = _drawn(monkeypatch, {"dot": rows})
  # It was one line labelled "dot": every member averaged, rates mixed (BLEU 6.5, 7.5).
  assert lines == {"dot learning_rate=0.001": ([60, 120], [1.5, 2.5]),
                   "dot learning_rate=0.003": ([60, 120], [11.5, 12.5])}
  assert title == "mean over seeds 0, 1"
  lines, _ = _drawn(monkeypatch, {"dot": rows}, {"learning_rate": 0.003})
  assert lines == {"dot learning_rate=0.003": ([60, 120], [11.5, 12.5])}


def test_a_run_of_seeds_only_stays_one_curve(tmp_path, monkeypatch):
  rows = [{"step": s, "seed": seed, "val_bleu": s + seed, "val_ppl": 4.0}
          for s in (60, 120) for seed in (0, 1, 2)]
  lines, title = _drawn(monkeypatch, {"lr 3e-3": rows})
  assert lines == {"lr 3e-3": ([60, 120], [61.0, 121.0])}
  assert title == "mean over seeds 0, 1, 2"
  assert plots.seeds_note({"a": rows[:1]}) == "seed 0 (one seed)"


def test_the_driver_names_its_curves_and_what_they_average_and_refuses_a_bad_member(
    tmp_path, run_refusals):
  path = _members_log(tmp_path / "metrics.jsonl")
  run = f"--run=dot={path}"
  out = str(tmp_path / "c.png")
  drew, chose, absent, bad = run_refusals("experiments.plot_curves", [
      ([run, f"--out={out}"], tmp_path),
      ([run, f"--out={out}", "--member=learning_rate=3e-3"], tmp_path),
      ([run, f"--out={out}", "--member=learning_rate=0.01"], tmp_path),
      ([run, f"--out={out}", "--member=seed=1"], tmp_path)])
  assert drew.returncode == 0, drew.stderr
  assert drew.stdout == (f"wrote {out}: 2 curves (dot learning_rate=0.001; dot "
                         "learning_rate=0.003), each the mean over seeds 0, 1\n")
  assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert chose.stdout == (f"wrote {out}: 1 curve (dot learning_rate=0.003), each the mean "
                          "over seeds 0, 1\n")
  assert absent.returncode == 1 and absent.stderr.strip() == (
      "error: `--member` learning_rate=0.01 matches no line of the runs; their member "
      "values: learning_rate=0.001, learning_rate=0.003.")
  assert bad.returncode == 1 and "`--member` must be FIELD=VALUE with FIELD one of " \
      "learning_rate, got 'seed=1'." in bad.stderr
