r"""How close a training step comes to the machine's own float32 matmul peak.

    python -m experiments.cpu_efficiency --out=results/cpu_efficiency/DATE.jsonl
    python -m experiments.cpu_efficiency --cells=additive:1024 --seeds=2 --threads=0

One process, on one core (`--threads=1`, the default: how a `--workers`
process of the quick preset trains) or on every core (`--threads=0`). It
measures:

1. **The peak**: FLOP/s of jitted float32 matrix products
   (`benchmarking.matmul_rates`: large squares, the quick model's batch-wide
   projections and its one-step products); the best is the peak.
2. **Each cell** (`--cells`, ARM:DIM of `--preset`) for each seed count
   (`--seeds`, vmapped as the sweep trains them), with the sweep's own trainer
   (`train_lib.EnsembleTrainer`, its compiled step) on the first `--batches`
   real batches of its training stream at the longest bucket length that has
   that many among the first 50 x `--batches` (64 pairs x 32 tokens in the
   quick preset: one shape, one compilation): one untimed pass
   warms up, a second is timed step by step (each step waits for its loss, as
   the trainer does). FLOPs of a step are counted three ways:

   - `flops`: from the step's jaxpr (`attention_jax.flops`, loops times their
     trip counts, backward and recomputation included): the figure used;
   - `hand_matmul`: the model's matrix products counted by hand
     (`hand_matmul_flops`, three times the forward for forward + backward):
     a check of the above;
   - `xla_flops`: XLA's `cost_analysis` of the compiled step, which counts
     each loop body once, shown to say why it cannot be used.

   Reported: matmul FLOP/s achieved (the jaxpr's matrix-product FLOPs over the
   measured seconds; the elementwise rest, counted roughly, is in the row as
   `flops` but not in the share), its share of the peak, and target tokens/s
   (non-pad target tokens of every member).

Writes one JSON row per cell and seed count, and one for the peak, to `--out`
(appended, each row stamped with its provenance), and prints a table.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined only when this module is the program, since
  other drivers that tests import beside it define `--preset` and `--seeds` too."""
  flags.DEFINE_string("preset", "quick", "The sweep preset whose cells are measured.")
  flags.DEFINE_string("cells", "multiplicative:128,multiplicative:1024,additive:128,"
                      "additive:1024", "Comma-separated ARM:DIM cells of the preset.")
  flags.DEFINE_string("seeds", "1,2", "Comma-separated seed counts (members trained as one "
                      "vmapped program).")
  flags.DEFINE_integer("batches", 20, "Real training batches timed per cell and seed count.")
  flags.DEFINE_integer("threads", 1, "1: this process on one core (`--core`), as a --workers "
                       "process trains; 0: every core.")
  flags.DEFINE_integer("core", None, "With --threads=1: the core to run on (default: the "
                       "first this process may use).")
  flags.DEFINE_integer("repeats", 7, "Timed calls per matmul shape of the peak.")
  flags.DEFINE_string("out", None, "JSON-lines file the rows are appended to (optional).")

def hand_matmul_flops(config, batch: int, src_len: int, tgt_len: int) -> float:
  """Matrix-product FLOPs of one forward + backward pass of a GRU/LSTM Seq2Seq.

  Counted from the model's definition (models/seq2seq.py), 2 FLOPs per
  multiply-add: encoder cells (input and recurrent products per direction
  and step), the decoder cells, the bridge, the attention (key and query
  projections, scores, context) and Luong's mix, the output layer. The
  backward pass of a product costs two products, so the total is three
  forwards. The additive score's `v · tanh(...)` is the one exception that
  comes out the same: its backward pass has one product (dv; the gradient of
  the tanh layer is an outer product, elementwise) and the forward product is
  recomputed there (`jax.checkpoint`). Only the projected scores (additive,
  multiplicative, scaled_multiplicative) are counted; others raise a ValueError.
  """
  c = config
  b, s, t, h = batch, src_len, tgt_len, config.hidden_dim
  gates = 3 if c.cell == "gru" else 4
  cell = lambda steps, d_in: 2 * b * steps * (d_in + h) * gates * h
  directions = 2 if c.bidirectional else 1
  fwd, d_in = 0.0, c.embed_dim
  for _ in range(c.encoder_layers):
    fwd += directions * cell(s, d_in)
    d_in = c.encoder_dim
  fwd += cell(t, c.embed_dim + c.feed_dim)
  fwd += (c.decoder_layers - 1) * cell(t, h)
  if c.use_bridge:
    parts = 2 if c.cell == "lstm" else 1
    fwd += 2 * b * (c.encoder_layers * directions * parts * h) * (c.decoder_layers * parts * h)
  if c.has_attention:
    if c.score not in ("additive", "multiplicative", "scaled_multiplicative"):
      raise ValueError(f"no hand count for score {c.score!r}: only the projected scores.")
    a, de = c.attention_dim, c.encoder_dim
    fwd += 2 * b * s * de * a + 2 * b * t * h * a + 2 * b * t * s * a + 2 * b * t * s * de
    if c.decoder == "luong":
      fwd += 2 * b * t * (h + de) * h
  fwd += 2 * b * t * h * c.vocab_size
  return 3 * fwd


def _check_flags():
  """Every flag checked before any work: (cells, seed counts); exits with one line."""
  from experiments import common  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import calibration  # pylint: disable=g-import-not-at-top
  from attention_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  try:
    cells = calibration.parse_cells(FLAGS.cells)
    seeds = common.parse_list("seeds", FLAGS.seeds, int)
    if min(seeds) < 1:
      raise ValueError(f"`--seeds` must be positive seed counts, got {FLAGS.seeds!r}.")
    if FLAGS.batches < 1:
      raise ValueError(f"`--batches` must be >= 1, got {FLAGS.batches}.")
    if FLAGS.threads not in (0, 1):
      raise ValueError(f"`--threads` must be 1 or 0 (every core), got {FLAGS.threads}.")
    if FLAGS.core is not None and FLAGS.core not in os.sched_getaffinity(0):
      raise ValueError(f"`--core` {FLAGS.core} is not one this process may run on "
                       f"({sorted(os.sched_getaffinity(0))}).")
    cfg = config_lib.from_preset(FLAGS.preset)
    for arm, dim in cells:
      cfg.point(config_lib.Arm.of(arm, dim))
    if FLAGS.out and os.path.isdir(FLAGS.out):
      raise ValueError(f"`--out` {FLAGS.out} is a folder; give a file.")
  except (ValueError, TypeError, KeyError) as e:
    sys.exit(f"error: {e}")
  return cfg, cells, seeds


def measure(cfg, arm: str, dim: int, seeds: int, data, n_batches: int) -> dict:
  """One cell at one seed count (module docstring, 2)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from attention_jax import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top

  run = dataclasses.replace(cfg, seeds=seeds).point(config_lib.Arm.of(arm, dim))
  trainer = train_lib.EnsembleTrainer(run, data)
  stream = trainer._train_batches(0)  # pylint: disable=protected-access
  by_length = {}  # padded length -> batches, from the start of the stream
  for _ in range(50 * n_batches):
    batch = next(stream)
    by_length.setdefault(batch.src.shape[1], []).append(batch)
  full = [length for length, found in by_length.items() if len(found) >= n_batches]
  length = max(full) if full else max(by_length, key=lambda k: len(by_length[k]))
  batches = [trainer.evaluator.teacher_forced(b) for b in by_length[length][:n_batches]]
  params, opt_state = trainer.state.params, trainer.state.opt_state
  args = lambda i, b: (params, trainer.rest, opt_state, np.int32(i), *b)
  step_fn = trainer._train_step  # pylint: disable=protected-access
  counted = flops_lib.count(step_fn, *args(0, batches[0]))
  compiled = step_fn.lower(*args(0, batches[0])).compile()
  xla = compiled.cost_analysis()
  xla = float((xla[0] if isinstance(xla, (list, tuple)) else xla).get("flops", 0.0))
  src, tgt_in = batches[0][0], batches[0][1]
  try:
    hand = seeds * hand_matmul_flops(trainer.model_config, src.shape[0], src.shape[1],
                                     tgt_in.shape[1])
  except ValueError:
    hand = None
  times = []
  for i, batch in enumerate(batches * 2):  # the first pass warms up
    start = time.perf_counter()
    params, opt_state, loss = compiled(*args(i, batch))
    np.asarray(loss)  # waits for the step, as the trainer does
    if i >= len(batches):
      times.append(time.perf_counter() - start)
  tokens = seeds * sum(int(np.sum(np.asarray(b[2]) != data.tokenizer.pad_id)) for b in batches)
  seconds = sum(times)
  n = len(times)
  return {"kind": "step", "preset": FLAGS.preset, "arm": arm, "dim": dim, "seeds": seeds,
          "batches": n, "batch_size": int(src.shape[0]), "length": int(src.shape[1]),
          "seconds": seconds, "step_median_s": statistics.median(times),
          "flops": n * counted.total, "matmul_flops": n * counted.matmul,
          "hand_matmul_flops": None if hand is None else n * hand,
          "xla_flops": n * xla, "flops_per_s": n * counted.total / seconds,
          "matmul_flops_per_s": n * counted.matmul / seconds,
          "target_tokens_per_s": tokens / seconds}


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  cfg, cells, seed_counts = _check_flags()
  from attention_jax.training import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.keep_freed_memory()  # as the trainer's drivers do, before JAX starts
  if FLAGS.threads == 1:  # before the first jax call below starts the CPU client
    from attention_jax.training import workers  # pylint: disable=g-import-not-at-top
    workers.use_one_core(FLAGS.core)
  from attention_jax import benchmarking  # pylint: disable=g-import-not-at-top
  from attention_jax.training import datasets  # pylint: disable=g-import-not-at-top
  from attention_jax.training import files  # pylint: disable=g-import-not-at-top
  from attention_jax.training import provenance  # pylint: disable=g-import-not-at-top

  machine = benchmarking.machine_description()
  print(f"{machine['cpu']}, jax {machine['jax_version']}, cores "
        f"{sorted(os.sched_getaffinity(0))}")
  rates = benchmarking.matmul_rates(repeats=FLAGS.repeats)
  peak_shape, peak = max(rates.items(), key=lambda kv: kv[1])
  rows = [{"kind": "matmul_peak", "threads": FLAGS.threads, "peak_flops_per_s": peak,
           "peak_shape": list(peak_shape),
           "rates": {"x".join(map(str, k)): v for k, v in rates.items()}, **machine}]
  for shape, rate in rates.items():
    print(f"  matmul {shape}: {rate / 1e9:7.1f} GFLOP/s")
  data = datasets.load_data(cfg)
  print(f"| cell | seeds | step ms | matmul GFLOP/step (jaxpr / by hand) | all GFLOP/step "
        f"(jaxpr / XLA) | matmul GFLOP/s | "
        f"share of peak {peak / 1e9:.0f} | target tokens/s |")
  print("|---|---|---|---|---|---|---|---|")
  for arm, dim in cells:
    for seeds in seed_counts:
      row = measure(cfg, arm, dim, seeds, data, FLAGS.batches)
      row.update(threads=FLAGS.threads, peak_flops_per_s=peak,
                 share_of_peak=row["matmul_flops_per_s"] / peak, **machine)
      rows.append(row)
      per = lambda x: "-" if x is None else f"{x / FLAGS.batches / 1e9:.2f}"
      print(f"| {arm}:{dim} | {seeds} | {row['step_median_s'] * 1e3:.0f} | "
            f"{per(row['matmul_flops'])} / {per(row['hand_matmul_flops'])} | "
            f"{per(row['flops'])} / {per(row['xla_flops'])} | "
            f"{row['matmul_flops_per_s'] / 1e9:.1f} | {row['share_of_peak']:.1%} | "
            f"{row['target_tokens_per_s']:,.0f} |", flush=True)
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    old = open(FLAGS.out, encoding="utf-8").read() if os.path.exists(FLAGS.out) else ""
    files.atomic_write(FLAGS.out, old + "".join(
        json.dumps(provenance.stamp(r)) + "\n" for r in rows))
    print(f"appended {len(rows)} rows to {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
