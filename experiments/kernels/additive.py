"""The additive suite: chunked vs naive additive attention, forward+backward.

The library's `scores.additive` never holds the `[B, Tq, Tk, a]` tanh block
that `scores.additive_naive` builds; this suite shows it as compiled temp
memory over T (every length of `settings.additive_seq_lens`) and as time (up
to `settings.additive_time_max_len`; longer ones are `compiled_only`). Both
are checked against `bm.naive_attention` before they are timed.

`tile_search` (and `python -m experiments.kernels.additive`) times the
Pallas kernels at each tile `pallas_additive.tile_candidates` lists, with
either backward form, on a GPU or TPU.

Glossary: B batch, T sequence length (Tq = Tk), d query / key / value size
(64), a attention size.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from attention_jax.measure import benchmarking as bm
from attention_jax import pallas_additive
from attention_jax import scores as scores_lib
from experiments.kernels import jsonl
from experiments.kernels import resume
from experiments.kernels import settings as settings_lib
from experiments.kernels import timing
from experiments.kernels.settings import Settings

HEAD_DIM = 64  # d of the queries, keys and values
SCORE_FNS = {"additive_chunked": scores_lib.additive, "additive_naive": scores_lib.additive_naive}
# The fused Pallas kernels (`attention_jax/pallas_additive/`) give the context
# directly. Timed on an accelerator only: on a CPU they run in Pallas's
# interpret mode, a test path whose speed means nothing.
PALLAS_IMPL = "additive_pallas"


def impls_for(backend: str) -> tuple[str, ...]:
  """The implementations the suite compiles and times on `backend`."""
  return tuple(SCORE_FNS) + ((PALLAS_IMPL,) if backend in ("gpu", "tpu") else ())
_ARGNUMS = (0, 1, 2, 3, 4, 5)  # gradients w.r.t. q, k, values, w_q, w_k, v_att


def _loss(score_fn: Callable | None, **pallas_kwargs) -> Callable:
  """sum(attention context · cot) with `score_fn` scores, the Pallas kernels
  (`PALLAS_IMPL`, given `pallas_kwargs`: blocks, backward, tanh_impl) or the
  naive reference (None)."""

  def loss(q, k, values, w_q, w_k, v_att, cot):
    if score_fn == PALLAS_IMPL:
      context = pallas_additive.additive_attention(q, k, values, w_q, w_k, v_att,
                                                   **pallas_kwargs)
    elif score_fn is None:
      context = bm.naive_attention(q, k, values, score="additive",
                                   params={"w_q": w_q, "w_k": w_k, "v": v_att})
    else:
      context, _ = aj.attend(score_fn(q, k, w_q, w_k, v_att), values)  # [B, T, d]
    return jnp.sum(context * cot)

  return loss


def _weights(keys, attention_dim: int):
  """`(w_q [d, a], w_k [d, a], v_att [a])`."""
  d, a = HEAD_DIM, attention_dim
  return (jax.random.normal(keys[0], (d, a)) / math.sqrt(d),
          jax.random.normal(keys[1], (d, a)) / math.sqrt(d),
          jax.random.normal(keys[2], (a,)) / math.sqrt(a))


def _reference(args, limit: int) -> tuple[Any, str]:
  """`(gradients, name)` of the first reference that compiles within `limit`
  bytes: the naive form (formula by formula), else the chunked library form,
  itself tested against the naive one at small sizes; `(None, why)` if neither."""
  failures = []
  for name, score_fn in (("naive", None), ("additive_chunked", SCORE_FNS["additive_chunked"])):
    try:
      compiled, _ = bm.compile_fn(jax.grad(_loss(score_fn), argnums=_ARGNUMS), *args)
    except Exception as e:  # pylint: disable=broad-except
      failures.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
      continue
    size = timing.compiled_bytes(bm.memory_stats(compiled))
    if size > limit:
      failures.append(f"{name}: {size / 2 ** 30:.1f} GiB over the limit")
      continue
    return jax.tree.map(np.asarray, compiled(*args)), name
  return None, "; ".join(failures)


def _checked_run(impl: str, compiled, args, reference, row: dict, write):
  """Runs `compiled` once (its time, the first call's) and checks its
  gradients against `reference`: the (row, bound call, first call's seconds)
  that the timing takes, or None, the mismatch written as a refused row."""
  start = time.perf_counter()
  grads = jax.block_until_ready(compiled(*args))
  first = time.perf_counter() - start
  try:
    row["max_abs_err"] = bm.verify_close(jax.tree.map(np.asarray, grads), reference,
                                         rtol=bm.default_tolerance("float32"), name=impl)
  except bm.KernelMismatchError as e:
    write({**row, "status": "refused", "reason": str(e)})
    return None
  return row, functools.partial(compiled, *args), first


def run(settings: Settings, write: Callable[[dict], None],
        progress: resume.Progress | None = None) -> None:
  """Chunked vs naive additive attention, forward+backward: temp memory and time
  (the lengths `progress.pending` says are not measured yet)."""
  progress = progress or resume.Progress((), {})
  limit = timing.memory_limit_bytes(settings.memory_limit_gb)
  b, a, d = settings.additive_batch, settings.additive_dim, HEAD_DIM
  keys = jax.random.split(jax.random.PRNGKey(settings.seed + 7), 8)
  weights = _weights(keys, a)
  for t in sorted(settings.additive_seq_lens):
    case = {"suite": "additive", "mode": "fwd_bwd", "dtype": "float32", "batch": b,
            "seq_len": t, "attention_dim": a, "head_dim": d}
    impls = progress.pending(case, impls_for(jax.default_backend()))
    if not impls:
      continue
    q, k, values, cot = (jax.random.normal(key, (b, t, d)) for key in keys[3:7])  # [B, T, d]
    args = (q, k, values, *weights, cot)
    timed = t <= settings.additive_time_max_len
    reference, reference_name = (_reference(args, limit) if timed else (None, None))
    if timed and reference is None:
      for impl in impls:
        write({**case, "impl": impl, "status": "skipped",
               "reason": f"no reference fits: {reference_name}; unverified forms are not timed"})
      continue
    ready = {}  # impl -> (row, call, first call seconds); timed interleaved below
    for impl in impls:
      score_fn = SCORE_FNS.get(impl, impl)
      row = {**case, "impl": impl}
      if timed:
        row["reference"] = reference_name
      try:
        compiled, compile_s = bm.compile_fn(jax.grad(_loss(score_fn), argnums=_ARGNUMS), *args)
      except Exception as e:  # pylint: disable=broad-except
        # A GPU's compiler fails on the naive form at T >= 1024 (XLA's autotuner
        # allocates its 128 GiB tanh block): a row says so, the other forms go on.
        write({**row, "status": "skipped",
               "reason": f"compile failed: {type(e).__name__}: {str(e)[:200]}"})
        continue
      memory = bm.memory_stats(compiled)
      row.update(memory, compile_s=compile_s)
      size = timing.compiled_bytes(memory)
      if not timed or size > limit:
        why = (f"T > --additive_time_max_len={settings.additive_time_max_len}" if not timed
               else f"compiled memory {size / 2 ** 30:.1f} GiB exceeds the limit")
        write({**row, "status": "compiled_only", "reason": why})
        continue
      entry = _checked_run(impl, compiled, args, reference, row, write)
      if entry is None:
        continue
      ready[impl] = entry
    if not ready:
      continue
    timings, other_load, attempts = timing.time_ready(ready, settings,
                                                      warmup=min(settings.warmup, 1))
    for impl, (row, _, _) in ready.items():
      write({**row, "status": "ok", **timing.timing_fields(timings[impl]),
             "other_load_cores": other_load, "attempts": attempts})


TILES_SUITE = "additive_tiles"


def tile_name(blocks: pallas_additive.Blocks, backward: str) -> str:
  """A candidate's `impl` in the rows: `additive_pallas 16x16x32w4 fused`."""
  return (f"{PALLAS_IMPL} {blocks.rows}x{blocks.cols}x{blocks.chunk}w{blocks.num_warps} "
          f"{backward}")


def tile_search(settings: Settings, write: Callable[[dict], None], seq_len: int, *,
                backwards: Sequence[str] = ("fused", "split"), tanh_impl: str = "accurate",
                candidates: Sequence[pallas_additive.Blocks] | None = None) -> int:
  """Times the Pallas kernels' forward + backward at the suite's shape
  (B = `additive_batch`, a = `additive_dim`, d = 64, T = `seq_len`, float32)
  for every tile of `pallas_additive.tile_candidates` (or `candidates`) and
  every form in `backwards`: one row each (`suite` "additive_tiles", `impl`
  as `tile_name`, `blocks`, `backward`, `tanh_impl`), timed interleaved so
  that the machine's drift reaches all alike. Each program is checked
  against the reference first (`_reference`); one that does not compile or
  disagrees gets a skipped or refused row and is not timed. Returns the
  number of candidates timed.

  Only on a GPU or TPU: on a CPU the kernels run in interpret mode, whose
  speed says nothing, so one skipped row is written and nothing is timed."""
  backend = jax.default_backend()
  b, a, d = settings.additive_batch, settings.additive_dim, HEAD_DIM
  case = {"suite": TILES_SUITE, "mode": "fwd_bwd", "dtype": "float32", "batch": b,
          "seq_len": seq_len, "attention_dim": a, "head_dim": d, "tanh_impl": tanh_impl}
  if backend not in ("gpu", "tpu"):
    write({**case, "impl": PALLAS_IMPL, "status": "skipped",
           "reason": f"the tile search times compiled kernels; backend {backend} has none"})
    return 0
  if candidates is None:
    candidates = pallas_additive.tile_candidates(backend, seq_len, seq_len, a, d)
  if backend == "tpu":
    backwards = [w for w in backwards if w == "split"]  # Mosaic: no atomic add
  limit = timing.memory_limit_bytes(settings.memory_limit_gb)
  keys = jax.random.split(jax.random.PRNGKey(settings.seed + 7), 8)
  weights = _weights(keys, a)
  q, k, values, cot = (jax.random.normal(key, (b, seq_len, d)) for key in keys[3:7])
  args = (q, k, values, *weights, cot)
  reference, reference_name = _reference(args, limit)
  ready = {}
  for blocks in candidates:
    for backward in backwards:
      impl = tile_name(blocks, backward)
      row = {**case, "impl": impl, "backward": backward, "reference": reference_name,
             "blocks": [blocks.rows, blocks.cols, blocks.chunk, blocks.num_warps]}
      if reference is None:
        write({**row, "status": "skipped", "reason": f"no reference fits: {reference_name}"})
        continue
      loss = _loss(PALLAS_IMPL, blocks=blocks, backward=backward, tanh_impl=tanh_impl)
      try:
        compiled, compile_s = bm.compile_fn(jax.grad(loss, argnums=_ARGNUMS), *args)
      except Exception as e:  # pylint: disable=broad-except
        write({**row, "status": "skipped",
               "reason": f"compile failed: {type(e).__name__}: {str(e)[:200]}"})
        continue
      row.update(bm.memory_stats(compiled), compile_s=compile_s)
      entry = _checked_run(impl, compiled, args, reference, row, write)
      if entry is None:
        continue
      ready[impl] = entry
  if not ready:
    return 0
  timings, other_load, attempts = timing.time_ready(ready, settings,
                                                    warmup=min(settings.warmup, 1))
  for impl, (row, _, _) in ready.items():
    write({**row, "status": "ok", **timing.timing_fields(timings[impl]),
           "other_load_cores": other_load, "attempts": attempts})
  return len(ready)


def parse_tile(text: str) -> pallas_additive.Blocks:
  """`16x16x32w4` (rows x cols x chunk, w warps; `w4` may be left out) -> Blocks."""
  body, _, warps = text.partition("w")
  sizes = body.split("x")
  if len(sizes) != 3 or not all(x.isdigit() for x in sizes) or not (warps or "4").isdigit():
    raise ValueError(f"a tile is ROWSxCOLSxCHUNK[wWARPS], e.g. 16x16x32w4; got {text!r}.")
  return pallas_additive.Blocks(*map(int, sizes), int(warps or 4))


def define_flags() -> None:
  """The tile search's flags, defined only when this module is the program
  (the benchmark driver imports it as a suite)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("workdir", None, "Folder of tiles.jsonl (created; rows appended).")
  flags.DEFINE_integer("seq_len", 1024, "T of the timed shape.")
  flags.DEFINE_enum("preset", "gpu", sorted(settings_lib.PRESETS), "Benchmark settings preset.")
  flags.DEFINE_string("backwards", "fused,split", "Backward forms to time, comma-separated.")
  flags.DEFINE_enum("tanh_impl", "accurate", list(pallas_additive.TANH_IMPLS), "tanh form.")
  flags.DEFINE_string("tiles", "", "Tiles ROWSxCOLSxCHUNK[wWARPS], comma-separated, instead of "
                      "every candidate (to fit a short device lease: each compiles its own "
                      "kernels).")


def main(argv: Sequence[str]) -> int:
  """`python -m experiments.kernels.additive --workdir=DIR [--seq_len=1024]
  [--preset=gpu] [--backwards=fused,split] [--tanh_impl=accurate]
  [--tiles=16x16x32w4,...]`: the tile search, its rows appended to
  DIR/tiles.jsonl (stamped with the machine, the commit and the versions, as
  benchmark.jsonl's) with the command line. A bad flag is one line, before
  any work."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  options = flags.FLAGS
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  if not options.workdir:
    sys.exit("error: --workdir is required: the folder of tiles.jsonl.")
  try:
    tiles = [parse_tile(t) for t in options.tiles.split(",") if t] or None
  except ValueError as e:
    sys.exit(f"error: --tiles: {e}")
  backwards = tuple(options.backwards.split(","))
  for backward in backwards:
    if backward not in pallas_additive.BACKWARDS:
      sys.exit(f"error: --backwards: {backward!r} is not one of {pallas_additive.BACKWARDS}")
  settings = settings_lib.from_preset(options.preset)
  os.makedirs(options.workdir, exist_ok=True)
  command = "python -m experiments.kernels.additive " + " ".join(argv[1:] or sys.argv[1:])
  run_id = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}/{os.getpid()}"
  with jsonl.appending(os.path.join(options.workdir, "tiles.jsonl"), bm.machine_description(),
                       run_id) as append:
    timed = tile_search(settings, lambda row: append({**row, "command": command}),
                        options.seq_len, backwards=backwards, tanh_impl=options.tanh_impl,
                        candidates=tiles)
  print(f"timed {timed} candidates")
  return 0


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main)
