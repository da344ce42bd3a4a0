r"""One sweep's table from another device beside the committed one, cell by cell.

    python -m experiments.compare_devices --reference=results/quick_cpu \
        --other=runs/quick_gpu --out=results/quick_gpu/compare_cpu.md

Both folders are a sweep's workdir (or its committed copy): `results.jsonl`
with a row per (arm, dim, seed), and, where kept, each run's test outputs
(`runs/<arm>_d<dim>/test_translations.json[.gz]`). The other device must
have run the reference's recipe unchanged: rows whose recipe fields differ
(`RECIPE`: steps, dataset, model, the preset's data and evaluation sizes as
the rows record them) are refused in one line naming the field, before any
comparison. Per cell: the reference's seeds and their mean ± std, the
other's seeds and mean, the difference of means, whether the other's mean
lies inside the reference's seed range, and, where both kept their test
outputs, the seed-paired approximate-randomisation test of each seed pair
(the same seed on both devices starts from the same parameters and sees the
same batches: `significance.compare_runs`). Two seeds tell a range, not a
distribution: the table says what it compares and claims no more.
"""

from __future__ import annotations

import json
import math
import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
# Row fields that make two sweeps the same recipe (what results.jsonl rows record).
RECIPE = ("model", "dataset", "steps", "params")


def define_flags() -> None:
  flags.DEFINE_string("reference", None, "The reference sweep's folder (e.g. results/quick_cpu).")
  flags.DEFINE_string("other", None, "The other device's sweep folder.")
  flags.DEFINE_string("out", "", "Markdown file to write ('' = print only).")
  flags.DEFINE_integer("trials", 10000, "Approximate-randomisation trials per seed pair.")


def read_rows(folder: str, flag: str) -> list[dict]:
  """`folder`/results.jsonl's rows; a ValueError of one line naming the flag
  or the file and line where they cannot be read."""
  path = os.path.join(folder, "results.jsonl")
  if not os.path.isfile(path):
    raise ValueError(f"{flag}: no results.jsonl in {folder!r}; is it a sweep's folder?")
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        if not isinstance(row, dict):
          raise ValueError
        rows.append(row)
      except ValueError:
        raise ValueError(f"{path}: line {number} is not a result row.") from None
  if not rows:
    raise ValueError(f"{path} holds no row.")
  return rows


def recipe_problem(reference: list[dict], other: list[dict]) -> str | None:
  """The first recipe field (`RECIPE`) in which the two sweeps' rows differ,
  as one line; None if they ran the same recipe."""
  for field in RECIPE:
    ours = {json.dumps(r.get(field)) for r in reference}
    theirs = {json.dumps(r.get(field)) for r in other}
    if ours != theirs:
      return (f"the two sweeps ran different recipes: `{field}` is {sorted(ours)} in "
              f"--reference and {sorted(theirs)} in --other.")
  return None


def cells(rows: list[dict]) -> dict[tuple[str, int], dict[int, float | None]]:
  """{(arm, dim): {seed: test BLEU (None: diverged)}}."""
  out: dict[tuple[str, int], dict[int, float | None]] = {}
  for r in rows:
    bleu = r.get("test_bleu")
    out.setdefault((r["arm"], int(r["dim"])), {})[int(r["seed"])] = (
        None if bleu is None or not math.isfinite(bleu) else float(bleu))
  return out


def _mean_std(values: list[float]) -> tuple[float, float]:
  mean = sum(values) / len(values)
  var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
  return mean, math.sqrt(var)


def _seeds(values: dict[int, float | None]) -> str:
  return " / ".join("diverged" if v is None else f"{v:.2f}" for _, v in sorted(values.items()))


def compare(reference: list[dict], other: list[dict],
            paired: dict[tuple[str, int], dict] | None = None) -> tuple[list[dict], str]:
  """Each cell's comparison (a dict per cell) and the Markdown table.
  `paired`: the seed-paired tests per cell where both kept their outputs."""
  from attention_jax.analysis import tables  # pylint: disable=g-import-not-at-top
  ours, theirs = cells(reference), cells(other)
  records = []
  header = ["arm", "dim", "reference seeds", "reference mean ± std", "other seeds",
            "other mean", "other − reference", "inside the reference's range",
            "seed-paired tests (p per pair)"]
  lines = []
  for key in sorted(set(ours) | set(theirs)):
    a, b = ours.get(key, {}), theirs.get(key, {})
    known_a = [v for v in a.values() if v is not None]
    known_b = [v for v in b.values() if v is not None]
    record = {"arm": key[0], "dim": key[1], "reference": a, "other": b}
    if known_a and known_b:
      mean_a, std_a = _mean_std(known_a)
      mean_b, _ = _mean_std(known_b)
      record.update(reference_mean=mean_a, reference_std=std_a, other_mean=mean_b,
                    delta=mean_b - mean_a, inside=min(known_a) <= mean_b <= max(known_a))
    test = (paired or {}).get(key)
    record["paired"] = test
    records.append(record)
    cell = lambda name, fmt: "–" if name not in record else fmt(record[name])
    tests = "–" if not test else ", ".join(
        f"{d:+.2f} (p {p:.3f})" for d, p in zip(test["deltas"], test["p"]))
    lines.append([
        key[0], str(key[1]), _seeds(a) or "–",
        "–" if "reference_mean" not in record else
        f"{record['reference_mean']:.2f} ± {record['reference_std']:.2f}",
        _seeds(b) or "–", cell("other_mean", lambda x: f"{x:.2f}"),
        cell("delta", lambda x: f"{x:+.2f}"), cell("inside", lambda x: "yes" if x else "no"),
        tests])
  return records, tables.markdown(header, lines)


def paired_tests(reference: str, other: str, keys, trials: int) -> dict:
  """`significance.compare_runs` of each cell whose runs kept their test
  outputs in both folders; cells without them are left out."""
  from attention_jax.analysis import significance  # pylint: disable=g-import-not-at-top
  from attention_jax.training import run_folder  # pylint: disable=g-import-not-at-top
  out = {}
  for arm, dim in keys:
    runs = [run_folder.RunDir(os.path.join(folder, "runs", f"{arm}_d{dim}"))
            for folder in (reference, other)]
    if all(r.stored_translations for r in runs):
      out[(arm, dim)] = significance.compare_runs(runs[0].test_translations(),
                                                  runs[1].test_translations(), trials)
  return out


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  for flag in ("reference", "other"):
    if not getattr(FLAGS, flag):
      sys.exit(f"error: --{flag} is required: a sweep's folder.")
  if FLAGS.trials < 1:
    sys.exit(f"error: --trials must be >= 1, got {FLAGS.trials}.")
  if FLAGS.out and os.path.isdir(FLAGS.out):
    sys.exit(f"error: --out: {FLAGS.out!r} is a folder; name the Markdown file to write.")
  try:
    reference = read_rows(FLAGS.reference, "--reference")
    other = read_rows(FLAGS.other, "--other")
    problem = recipe_problem(reference, other)
    if problem:
      raise ValueError(problem)
    keys = sorted(set(cells(reference)) & set(cells(other)))
    paired = paired_tests(FLAGS.reference, FLAGS.other, keys, FLAGS.trials)
  except ValueError as e:
    sys.exit(f"error: {e}")
  _, table = compare(reference, other, paired)
  text = (f"Test BLEU, {FLAGS.other} against {FLAGS.reference} (seed by seed; mean ± std "
          "over the reference's seeds; p: seed-paired approximate randomisation where "
          "both kept their test outputs)\n\n" + table)
  print(text)
  if FLAGS.out:
    from attention_jax import files  # pylint: disable=g-import-not-at-top
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    files.atomic_write(FLAGS.out, text)
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
