r"""How close a training step comes to the machine's own float32 matmul peak.

    python -m experiments.cpu_efficiency.run --out=results/cpu_efficiency/DATE.jsonl
    python -m experiments.cpu_efficiency.run --cells=additive:1024 --seeds=2 --threads=0
    python -m experiments.cpu_efficiency.run --preset=transformer \
        --cells=scaled_dot:16,scaled_dot:1024 --seeds=1 --profile=runs/trace
    python -m experiments.cpu_efficiency.run --preset=transformer --num_heads=4 \
        --cells=scaled_dot:16,scaled_dot:64,scaled_dot:256,scaled_dot:1024 --seeds=2

Either model family: the RNN of the quick preset or the Transformer of the
`transformer` preset (`--preset`; a flag per config field, e.g. `--num_heads`,
changes the preset's value as the sweep's drivers take it). One process, on one core (`--threads=1`,
the default: how a `--workers` process of both presets trains) or on every
core (`--threads=0`). It measures:

1. **The peak**: FLOP/s of jitted float32 matrix products
   (`benchmarking.matmul_rates`: large squares, the quick model's batch-wide
   projections and its one-step products); the best is the peak.
2. **Each cell** (`--cells`, ARM:DIM of `--preset`) for each seed count
   (`--seeds`, vmapped as the sweep trains them), with the sweep's own trainer
   (`train_lib.EnsembleTrainer`, its compiled step) on the first `--batches`
   real batches of its training stream at the longest bucket length that has
   that many among the first 50 x `--batches` (64 pairs x 32 tokens in the
   quick and transformer presets: one shape, one compilation): one untimed pass
   warms up, a second is timed step by step (each step waits for its loss, as
   the trainer does). FLOPs of a step are counted four ways:

   - `flops`: from the step's jaxpr (`attention_jax.measure.flops`, loops times their
     trip counts, backward and recomputation included): the figure used;
   - `hand_matmul`: the model's matrix products counted by hand
     (`hand_matmul_flops`: `rnn_matmul_flops` or `transformer_matmul_flops`,
     three times the forward for forward + backward): a check of the above,
     equal to it for the scores each count covers (tests); none otherwise;
   - `xla_loop_aware_flops`: XLA's cost analysis of the compiled step with
     each loop body counted trip-count times (`measure.hlo.loop_aware_cost`):
     the compiler's check of the jaxpr's total (9.71 against 9.49 GFLOP per
     quick step at a = 128; XLA counts elementwise work its own way);
   - `xla_flops`: XLA's `cost_analysis` as it is, which counts each loop body
     once (3.83), shown to say why it cannot be used.

   Reported: matmul FLOP/s achieved (the jaxpr's matrix-product FLOPs over the
   measured seconds; the elementwise rest, counted roughly, is in the row as
   `flops` but not in the share), its share of the peak, and target tokens/s
   (non-pad target tokens of every member). The steps' and the peak product's
   CPU time are measured too (`cpu_fraction`: the share of its core the
   process got; `cpu_share_of_peak`: the share with both timed by CPU time),
   so that a run on a core another process shares still says what the step
   would reach alone, up to the other process's use of caches and memory.

3. **Where the time goes** (`--profile=DIR`): the step is compiled again with
   XLA:CPU's per-thunk trace marks, the `--batches` steps run under
   `jax.profiler.trace` (files in DIR/ARM_DIM_seedsN/, with the compiled HLO),
   and each thunk's time is attributed to the part of the model its op comes
   from and to forward or backward (`attention_jax.measure.hlo_profile`:
   the RNN's by its named scopes, the Transformer's by the call stack XLA
   keeps for every op). The trace marks slow a step down by 5–10%.

Writes one JSON row per cell and seed count, and one for the peak, to `--out`
(appended as each is measured, each row stamped with its provenance), and
prints a table. Bad flags and an `--out` or `--profile` path that cannot be
written are refused in one line before any measuring.
"""

from __future__ import annotations

import functools
import json
import os
import sys

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
  flags.DEFINE_bool("keep_freed_memory", True, "Set glibc malloc as the trainer's drivers do "
                    "(sweep/host_memory.py); false measures the allocator's defaults, as "
                    "code before that change ran.")
  flags.DEFINE_string("out", None, "JSON-lines file the rows are appended to (optional).")
  flags.DEFINE_string("profile", None, "Folder: also trace the timed steps of each cell with "
                      "jax.profiler (and write the compiled HLO) there, and report where the "
                      "time goes (module docstring, 3).")
  # A flag per config field, over the preset (e.g. --num_heads=4), as the sweep takes them.
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  from experiments import common  # pylint: disable=g-import-not-at-top
  common.define_field_flags(config_lib.ExperimentConfig, skip=("arms", "dims", "seeds"))

def hand_matmul_flops(config, batch: int, src_len: int, tgt_len: int) -> float:
  """Matrix-product FLOPs of one training step of one member, counted by hand
  from the model's definition: `rnn_matmul_flops` for a `Seq2SeqConfig`,
  `transformer_matmul_flops` for a `TransformerConfig`. A ValueError says
  what a count does not cover (the caller then reports none); a TypeError
  names a config of neither family."""
  from attention_jax import models  # pylint: disable=g-import-not-at-top
  if isinstance(config, models.Seq2SeqConfig):
    return rnn_matmul_flops(config, batch, src_len, tgt_len)
  if isinstance(config, models.TransformerConfig):
    return transformer_matmul_flops(config, batch, src_len, tgt_len)
  raise TypeError(f"no hand count for a {type(config).__name__}: give a Seq2SeqConfig or "
                  "a TransformerConfig.")


def rnn_matmul_flops(config, batch: int, src_len: int, tgt_len: int) -> float:
  """Matrix-product FLOPs of one forward + backward pass of a GRU/LSTM Seq2Seq.

  Counted from the model's definition (models/seq2seq.py), 2 FLOPs per
  multiply-add: encoder cells (input and recurrent products per direction
  and step), the decoder cells, the bridge, the attention (key and query
  projections, scores, context) and Luong's mix, the output layer. The
  backward pass of a product costs two products, so the total is three
  forwards. The additive score's `v · tanh(...)` is the one exception that
  comes out the same: its backward pass has one product (dv; the gradient of
  the tanh layer is an outer product, elementwise) and the forward product is
  recomputed there (`jax.checkpoint`). Only the projected scores
  (`registry.Score.projected`: the key and query projections above, then one
  product of a per (query, key) pair; a scale or norm besides is elementwise)
  are counted; others raise a ValueError.
  """
  from attention_jax import registry  # pylint: disable=g-import-not-at-top
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
    if not registry.get(c.score).projected:
      raise ValueError(f"no hand count for score {c.score!r}: only the projected scores.")
    a, de = c.attention_dim, c.encoder_dim
    fwd += 2 * b * s * de * a + 2 * b * t * h * a + 2 * b * t * s * a + 2 * b * t * s * de
    if c.decoder == "luong":
      fwd += 2 * b * t * (h + de) * h
  fwd += 2 * b * t * h * c.vocab_size
  return 3 * fwd


def transformer_matmul_flops(config, batch: int, src_len: int, tgt_len: int) -> float:
  """Matrix-product FLOPs of one forward + backward pass of a `Transformer`.

  Counted from the model's definition (models/transformer.py, layers.py), 2
  FLOPs per multiply-add, with B batch, S source and T target length, D
  d_model, H heads of query/key size d_k and value size d_v = D / H, F d_ff,
  V vocabulary:

  - an attention block of Tq queries over Tk keys: the query projection
    (Tq·D·H·d_k), key and value projections (Tk·D·H·(d_k + d_v)), output
    projection (Tq·H·d_v·D), scores q·kᵀ (H·Tq·Tk·d_k) and the weighted sum
    of the values (H·Tq·Tk·d_v);
  - the FFN: two products of n·D·F for n positions;
  - each encoder layer: self attention over S and the FFN; each decoder layer:
    causal self attention over T (the mask hides half the scores; they are
    still computed), cross attention of T queries over S keys, the FFN;
  - the pre-softmax projection, T·D·V: the tied embedding table or the
    separate output layer; embedding lookups are gathers, no products.

  Every product's operands both depend on the parameters, so its backward
  pass costs two products: three forwards in all. LayerNorm, softmax, the
  loss and Adam are elementwise work (the jaxpr count's `other`).

  Covers the plain attention kernel (every key axis under
  `attention._BLOCKWISE_MIN_KEYS`, as the presets' batches are) with the
  scores whose logits are one product q·kᵀ per head of the projected query
  and keys (`registry.Score.one_product`: scaled or normalised elementwise;
  `general` and `additive` add per-head matrices, `location` is no q·kᵀ)
  and no dropout on the attention weights (which recomputes the weighted
  sum); a ValueError names what it does not.
  """
  from attention_jax import registry  # pylint: disable=g-import-not-at-top
  c = config
  if not registry.get(c.score).one_product:
    covered = tuple(n for n, s in registry.SCORES.items() if s.one_product)
    raise ValueError(f"no hand count for score {c.score!r}: only {covered}.")
  if c.attention_dropout:
    raise ValueError(f"no hand count with attention_dropout {c.attention_dropout}: the "
                     "dropped-out weights' context is a product of its own.")
  b, s, t = batch, src_len, tgt_len
  d, h, f, v = c.d_model, c.num_heads, c.d_ff, c.vocab_size
  dk, dv = c.head_dim, c.d_model // c.num_heads

  def attention(queries: int, keys: int) -> float:
    return 2 * b * (queries * d * h * dk + keys * d * h * (dk + dv) + queries * h * dv * d
                    + h * queries * keys * (dk + dv))

  ffn = lambda n: 2 * b * n * d * f * 2
  fwd = c.num_encoder_layers * (attention(s, s) + ffn(s))
  fwd += c.num_layers * (attention(t, t) + attention(t, s) + ffn(t))
  fwd += 2 * b * t * d * v
  return 3 * fwd



def _check_flags():
  """Every flag checked before any work: (cells, seed counts); exits with one line."""
  from experiments import common  # pylint: disable=g-import-not-at-top
  from experiments import calibration  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  try:
    cells = calibration.parse_cells(FLAGS.cells)
    seeds = common.parse_list("seeds", FLAGS.seeds, int)
    if min(seeds) < 1:
      raise ValueError(f"`--seeds` must be positive seed counts, got {FLAGS.seeds!r}.")
    if FLAGS.batches < 1:
      raise ValueError(f"`--batches` must be >= 1, got {FLAGS.batches}.")
    if FLAGS.repeats < 1:
      raise ValueError(f"`--repeats` must be >= 1 (timed calls per matmul shape), "
                       f"got {FLAGS.repeats}.")
    if FLAGS.threads not in (0, 1):
      raise ValueError(f"`--threads` must be 1 or 0 (every core), got {FLAGS.threads}.")
    if FLAGS.core is not None and FLAGS.core not in os.sched_getaffinity(0):
      raise ValueError(f"`--core` {FLAGS.core} is not one this process may run on "
                       f"({sorted(os.sched_getaffinity(0))}).")
    given = {k: v for k, v in common.overrides().items() if k != "seeds"}  # ours: counts
    cfg = config_lib.from_preset(FLAGS.preset, **given)
    config_lib.check_family(cfg.model, given)
    for arm, dim in cells:
      cfg.point(config_lib.Arm.of(arm, dim))
    if FLAGS.profile:
      common.check_output_dir("profile", FLAGS.profile)
    if FLAGS.out:
      check_rows_file("out", FLAGS.out)
  except (ValueError, TypeError, KeyError) as e:
    sys.exit(f"error: {e}")
  return cfg, cells, seeds


def check_rows_file(flag: str, path: str) -> None:
  """Raises a ValueError naming `--flag` unless rows can be appended to `path`:
  a file that is UTF-8 text (its rows are read back and kept), or none yet in
  a folder that is (or can become) writable. Checked before the measuring,
  which takes minutes and whose rows a failed write would lose; creates nothing."""
  if os.path.isdir(path):
    raise ValueError(f"`--{flag}` {path} is a folder; give a file.")
  folder = os.path.dirname(os.path.abspath(path))
  probe = folder
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise ValueError(f"`--{flag}` {path}: {probe} is a file, so the folder {folder} cannot "
                     "be made.")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise ValueError(f"`--{flag}` {path}: no permission to write in {probe}.")
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        f.read()
    except UnicodeDecodeError as e:
      raise ValueError(f"`--{flag}` {path} is not UTF-8 text (byte {e.start}), so rows "
                       "cannot be appended to it; give a JSON-lines file or a new path.") from None
    except OSError as e:
      raise ValueError(f"`--{flag}` {path} cannot be read: {e.strerror}.") from None
    if not os.access(path, os.W_OK):
      raise ValueError(f"`--{flag}` {path}: no permission to write it.")


def append_rows(path: str, rows: list) -> None:
  """Appends `rows`, each stamped with its provenance, to the JSON-lines file
  `path` in one atomic write (the file is whole or as it was)."""
  from attention_jax import files  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import provenance  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  old = ""
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      old = f.read()
  if old and not old.endswith("\n"):
    old += "\n"
  files.atomic_write(path, old + "".join(json.dumps(provenance.stamp(r)) + "\n"
                                         for r in rows))


def cpu_fraction(cpu_seconds: float, wall_seconds: float, threads: int) -> float:
  """The share of its cores' time a process got: its CPU time over wall time
  times the cores it may use (one with `--threads=1`). 1.0 on an idle machine;
  about 0.5 where another process shares the core."""
  cores = 1 if threads == 1 else len(os.sched_getaffinity(0))
  return cpu_seconds / (wall_seconds * cores)


def matmul_rate_per_cpu_second(shape: tuple, repeats: int, threads: int) -> float:
  """FLOPs per CPU second (over the cores this process may use) of the jitted
  float32 product of `shape` `(M, K, N)`: the median of `repeats` calls after
  two untimed ones. The peak of `benchmarking.matmul_rates` is per second of
  wall time, which a process sharing its core spends partly waiting."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import benchmarking  # pylint: disable=g-import-not-at-top
  m, k, n = shape
  x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
  product = jax.jit(jnp.matmul).lower(x, w).compile()
  cores = 1 if threads == 1 else len(os.sched_getaffinity(0))
  times = benchmarking.time_steps(lambda _: product(x, w), repeats, warmup=2)
  return 2.0 * m * k * n / (times.cpu_median_s / cores)


def cpu_time_shares(row: dict, peak_per_cpu_s: float, threads: int) -> dict:
  """A cell's share of the peak with both measured by CPU time instead of wall
  time: on a shared core the scheduler's time slices drop out, and the peak
  and the step are compared as if each had had the core to itself (what stays
  in is the other process's use of the caches and memory bandwidth)."""
  fraction = cpu_fraction(row["cpu_seconds"], row["seconds"], threads)
  per_cpu_s = row["matmul_flops"] / (row["seconds"] * fraction)
  return {"cpu_fraction": fraction, "peak_flops_per_cpu_s": peak_per_cpu_s,
          "matmul_flops_per_cpu_s": per_cpu_s, "cpu_share_of_peak": per_cpu_s / peak_per_cpu_s}


def measure(cfg, arm: str, dim: int, seeds: int, data, n_batches: int) -> dict:
  """One cell at one seed count (module docstring, 2)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import benchmarking  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import hlo  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import hlo_profile  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import step_time  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import config as config_lib  # pylint: disable=g-import-not-at-top
  from attention_jax.training import train_lib  # pylint: disable=g-import-not-at-top

  run = dataclasses.replace(cfg, seeds=seeds).point(config_lib.Arm.of(arm, dim))
  trainer = train_lib.EnsembleTrainer(run, data)
  batches = step_time.one_length_batches(trainer, n_batches)
  state = {"params": trainer.state.params, "opt_state": trainer.state.opt_state}
  args = lambda i, b: (state["params"], trainer.rest, state["opt_state"], np.int32(i), *b)
  step_fn = trainer._train_step  # pylint: disable=protected-access
  traced_step = step_fn.trace(*args(0, batches[0]))  # traced once: counted and compiled
  counted = flops_lib.count_jaxpr(traced_step.jaxpr.jaxpr)
  lowered = traced_step.lower()
  compiled = lowered.compile()
  xla = compiled.cost_analysis()
  xla = float((xla[0] if isinstance(xla, (list, tuple)) else xla).get("flops", 0.0))
  xla_loops = hlo.loop_aware_cost(compiled.as_text(), hlo.cpu_cost_analysis)["flops"]
  src, tgt_in = batches[0][0], batches[0][1]
  try:
    hand = seeds * hand_matmul_flops(trainer.model_config, src.shape[0], src.shape[1],
                                     tgt_in.shape[1])
  except ValueError:
    hand = None
  n = len(batches)

  def run_step(program, i):  # step i on batch i mod n, from and into `state`
    state["params"], state["opt_state"], loss = program(*args(i, batches[i % n]))
    return np.asarray(loss)  # waits for the step, as the trainer does (a host copy)

  # The first pass over the batches warms up; the second is timed.
  times = benchmarking.time_steps(functools.partial(run_step, compiled), n, warmup=n)
  tokens = seeds * sum(int(np.sum(np.asarray(b[2]) != data.tokenizer.pad_id)) for b in batches)
  seconds = times.total_s
  parts = None
  if FLAGS.profile:
    # The same lowering, compiled again with the per-thunk trace marks.
    traced = lowered.compile(compiler_options={"xla_cpu_enable_xprof_traceme": True})
    traced_hlo = traced.as_text()
    folder = os.path.join(FLAGS.profile, f"{arm}_{dim}_seeds{seeds}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "step.hlo.txt"), "w", encoding="utf-8") as f:
      f.write(traced_hlo)
    for i in range(n):  # warm-up of the traced program, each step waited for
      run_step(traced, i)
    with jax.profiler.trace(folder):
      traced_times = benchmarking.time_steps(functools.partial(run_step, traced), n)
    import glob  # pylint: disable=g-import-not-at-top
    xspace = sorted(glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True))[-1]
    from attention_jax import models  # pylint: disable=g-import-not-at-top
    attribute = (hlo_profile.transformer_part_of
                 if isinstance(trainer.model_config, models.TransformerConfig)
                 else hlo_profile.part_of)
    parts = hlo_profile.breakdown(xspace, traced_hlo, n, traced_times.total_s / n, attribute)
  return {"kind": "step", "preset": FLAGS.preset, "model": run.family, "arm": arm,
          "dim": dim, "seeds": seeds,
          "profile": parts,
          "batches": n, "batch_size": int(src.shape[0]), "length": int(src.shape[1]),
          "seconds": seconds, "step_median_s": times.median_s,
          "cpu_seconds": times.cpu_total_s, "cpu_step_median_s": times.cpu_median_s,
          "flops": n * counted.total, "matmul_flops": n * counted.matmul,
          "hand_matmul_flops": None if hand is None else n * hand,
          "xla_flops": n * xla, "xla_loop_aware_flops": n * xla_loops,
          "flops_per_s": n * counted.total / seconds,
          "matmul_flops_per_s": n * counted.matmul / seconds,
          "target_tokens_per_s": tokens / seconds}


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  cfg, cells, seed_counts = _check_flags()
  from attention_jax.sweep import host_memory  # pylint: disable=g-import-not-at-top
  if FLAGS.keep_freed_memory:
    host_memory.keep_freed_memory()  # as the trainer's drivers do, before JAX starts
  if FLAGS.threads == 1:  # before the first jax call below starts the CPU client
    from attention_jax.sweep import workers  # pylint: disable=g-import-not-at-top
    workers.use_one_core(FLAGS.core)
  from attention_jax.analysis import tables  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import benchmarking  # pylint: disable=g-import-not-at-top
  from attention_jax.sweep import datasets  # pylint: disable=g-import-not-at-top

  machine = benchmarking.machine_description()
  print(f"{machine['cpu']}, jax {machine['jax_version']}, cores "
        f"{sorted(os.sched_getaffinity(0))}")
  rates = benchmarking.matmul_rates(repeats=FLAGS.repeats)
  peak_shape, peak = max(rates.items(), key=lambda kv: kv[1])
  peak_cpu = matmul_rate_per_cpu_second(peak_shape, FLAGS.repeats, FLAGS.threads)
  peak_row = {"kind": "matmul_peak", "threads": FLAGS.threads, "peak_flops_per_s": peak,
              "peak_flops_per_cpu_s": peak_cpu, "peak_shape": list(peak_shape),
              "rates": {"x".join(map(str, k)): v for k, v in rates.items()}, **machine}
  written = 0
  if FLAGS.out:  # each row as soon as it is measured: a stopped run keeps what it has
    append_rows(FLAGS.out, [peak_row])
    written += 1
  for shape, rate in rates.items():
    print(f"  matmul {shape}: {rate / 1e9:7.1f} GFLOP/s")
  data = datasets.load_data(cfg)
  print(f"peak {peak / 1e9:.1f} GFLOP/s; by CPU time (the same product timed again): "
        f"{peak_cpu / 1e9:.1f} GFLOP per CPU second")
  # The header now, a row as each cell is measured: a stopped run shows what it has.
  print(tables.markdown(["cell", "seeds", "step ms", "matmul GFLOP/step (jaxpr / by hand)",
                         "all GFLOP/step (jaxpr / XLA with loops / XLA body once)",
                         "matmul GFLOP/s", f"share of peak {peak / 1e9:.0f}", "CPU time / wall",
                         "share by CPU time", "target tokens/s"], []), end="")
  for arm, dim in cells:
    for seeds in seed_counts:
      row = measure(cfg, arm, dim, seeds, data, FLAGS.batches)
      row.update(threads=FLAGS.threads, peak_flops_per_s=peak,
                 share_of_peak=row["matmul_flops_per_s"] / peak, **machine)
      row.update(cpu_time_shares(row, peak_cpu, FLAGS.threads))
      if FLAGS.out:
        append_rows(FLAGS.out, [row])
        written += 1
      per = lambda x: "-" if x is None else f"{x / FLAGS.batches / 1e9:.2f}"
      print(tables.markdown(None, [[
          f"{arm}:{dim}", seeds, f"{row['step_median_s'] * 1e3:.0f}",
          f"{per(row['matmul_flops'])} / {per(row['hand_matmul_flops'])}",
          f"{per(row['flops'])} / {per(row['xla_loop_aware_flops'])} / {per(row['xla_flops'])}",
          f"{row['matmul_flops_per_s'] / 1e9:.1f}", f"{row['share_of_peak']:.1%}",
          f"{row['cpu_fraction']:.0%}", f"{row['cpu_share_of_peak']:.1%}",
          f"{row['target_tokens_per_s']:,.0f}"]]), end="", flush=True)
      if row["profile"]:
        print(profile_table(row["profile"], tables), flush=True)
  if FLAGS.out:
    print(f"appended {written} rows to {FLAGS.out}")


def profile_table(parts: list, tables) -> str:
  """`hlo_profile.breakdown`'s rows as a Markdown table (`tables`: the
  analysis module, imported by the caller once JAX is configured), with each
  part's share of the traced step."""
  step_ms = sum(r["ms"] for r in parts)
  return tables.markdown(
      ["part", "direction", "ms/step", "share", "in loop bodies ms", "matmul ms",
       "thunks/step (of them in loop bodies)"],
      [[r["part"], r["direction"], f"{r['ms']:.1f}", f"{r['ms'] / step_ms:.0%}",
        f"{r['loop_ms']:.1f}", f"{r['matmul_ms']:.1f}",
        f"{r['thunks']:.0f} ({r['loop_thunks']:.0f})"] for r in parts]).rstrip("\n")

if __name__ == "__main__":
  define_flags()
  app.run(main)
