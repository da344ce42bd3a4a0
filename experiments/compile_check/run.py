r"""Compile the project's programs for an H100 or a TPU on a CPU-only host.

    bash scripts/aot_env.sh    # once: .venv-aot (jax 0.11.2, libtpu, CUDA 13 plugin, cuDNN)
    .venv-aot/bin/python -m experiments.compile_check.run --target=h100 --out=results/compile_check
    .venv-aot/bin/python -m experiments.compile_check.run --target=tpu_v5e --out=results/compile_check
    .venv-aot/bin/python -m experiments.compile_check.run --target=h100 --programs=kernels \
        --kernel_seq_lens=512,4096 --out=runs/cc

No accelerator is needed: XLA compiles for a target it is only described.
TPUs come from libtpu's topologies (`jax.experimental.topologies`, e.g.
'v5e:2x2'; the program is compiled for one chip of it, as 'v5e:1x1' is
refused); the H100 from the jax CUDA plugin given a target description
(`compile_targets.h100_target_config()`: the device numbers XLA would
otherwise query).

Programs (--programs, comma-separated; `experiments.compile_check.cases`):
  gpu_sweep         the `gpu` preset's training step at every arm and
                    dimension: the sweep trainer's own vmapped-seeds step
                    (`EnsembleTrainer`), bfloat16, at the widest training batch.
  transformer_base  a Transformer-base training step (d_model 512, 8 heads,
                    d_ff 2048, 6 + 6 layers, vocabulary 32k, 128 x 64 tokens).
  kernels           the kernel benchmark's headline: scaled_dot, bfloat16,
                    B = 4, H = 16, D = 128, T = --kernel_seq_lens, causal and
                    not, forward and forward+backward; the library's `auto`,
                    and on the H100 also jax.nn's cuDNN kernel (`is_causal`).
  additive          the additive score at a = 1024 (B = 32, d = 64, float32,
                    forward+backward): the library's chunked form vs XLA's
                    naive `[B, Tq, Tk, a]` one, T = --additive_seq_lens; with
                    --additive_impls=pallas,... also the Pallas kernels
                    (`attention(score='additive', implementation='pallas')`).

On a target of several devices (h100x8: 8 H100s on one host; tpu_v5e_8: a
v5e-8, 8 chips on one host; tpu_v4_32: 16 v4 chips over 4 hosts), the
programs are training steps laid out on a (members, data) device mesh by the
library's placement (`experiments.compile_check.mesh`,
`attention_jax.training.placement`):
  gpu_members       the `gpu` preset's step (the additive arm at each dim,
                    standing for its 3 arms: within 2% of the slowest on
                    one H100 and one v5e),
                    its 4 members split over 4 devices (one each), the batch
                    whole on each: no collective.
  gpu_members_data  the same, members x data: 4 member groups, each batch
                    split over the devices of a group.
  gpu_data          today's data parallelism: the batch split over every
                    device, every member's gradients all-reduced.
  lr_grid           the `transformer_lr` grid's step at each d_k: 7 learning
                    rates x 3 seeds = 21 members in one program, padded to a
                    multiple of the devices and split over them.
  lr_grid_data      the grid as today: a run of 3 seeds per learning rate,
                    data-parallel over every device.
Their rows add the devices, mesh and hosts, the collectives of the step
(kind, count, bytes, group) and their predicted time.

    .venv-aot/bin/python -m experiments.compile_check.run --target=tpu_v5e_8 \
        --out=results/compile_check/multi_device

Per program a row (`compile_device.compile_case`): compiled or the error;
argument / output / alias / temporary bytes from XLA's memory analysis and
whether they fit the target's memory; FLOPs and bytes accessed; a predicted
time; whether the cuDNN flash-attention call is in the compiled program.
Written to `<out>/<target>.jsonl` (each row with its provenance: the commit,
the versions, the compiling host and the command, `compile_device.row_provenance`)
and `<out>/<target>.md` (`compile_tables`).

How the time is predicted: XLA's cost analysis counts a loop body once, so
every loop body is analysed on its own and multiplied by its trip count
(`attention_jax.measure.hlo.loop_aware_cost`); the time is the roofline plus
an assumed cost per kernel and per loop iteration
(`attention_jax.measure.compile_targets`). The TPU's own `optimal_seconds`
(loops once) is reported beside it.

The package imports jax, which must start with `ENVIRONMENT` set; so this
module imports it only inside the functions that run once it is set.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable

from absl import app
from absl import flags

FLAGS = flags.FLAGS

PROGRAMS = ("gpu_sweep", "transformer_base", "kernels", "additive")
# On a target of several devices (`experiments.compile_check.mesh`).
MESH_PROGRAMS = ("gpu_members", "gpu_members_data", "gpu_data", "lr_grid", "lr_grid_data")
ADDITIVE_IMPLS = ("chunked", "naive", "pallas")
DEFAULT_KERNEL_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_ADDITIVE_SEQ_LENS = (256, 512, 1024, 2048, 4096)

# Set before jax is imported: compile for the described devices only, never
# look for a local one (the CUDA plugin's version checks need a driver).
# libtpu takes a lock file that lets one process on a machine use the TPUs;
# with none to use, two compile checks (or one and its tests) may run side by
# side (ALLOW_MULTIPLE_LIBTPU_LOAD).
ENVIRONMENT = {"JAX_PLATFORMS": "cpu", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
               "CUDA_VISIBLE_DEVICES": "-1", "TPU_SKIP_MDS_QUERY": "1",
               "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def configure_environment() -> None:
  """Sets `ENVIRONMENT` for jax, which must not have started yet (exits if it has)."""
  if "jax" in sys.modules:
    sys.exit("error: jax was imported before the compile check could configure it.")
  for key, value in ENVIRONMENT.items():
    os.environ.setdefault(key, value)


def define_flags() -> None:
  """The command line's flags; defined only when this module is the program
  (other drivers define flags of the same names, e.g. `--out`, and tests
  import them side by side)."""
  from attention_jax.measure import compile_targets  # pylint: disable=g-import-not-at-top
  targets = ", ".join(compile_targets.TARGETS)
  flags.DEFINE_string("target", None, f"What to compile for: one of {targets}.")
  flags.DEFINE_string("programs", None,
                      f"Comma-separated programs from {', '.join(PROGRAMS + MESH_PROGRAMS)} "
                      f"(default: {', '.join(PROGRAMS)} on one device, "
                      f"{', '.join(MESH_PROGRAMS)} on several).")
  flags.DEFINE_string("out", None, "Folder for <target>.jsonl and <target>.md.")
  flags.DEFINE_string("kernel_seq_lens", ",".join(map(str, DEFAULT_KERNEL_SEQ_LENS)),
                      "Kernel program: sequence lengths T.")
  flags.DEFINE_bool("report_only", False, "Rewrite <out>/<target>.md from its jsonl; compile "
                    "nothing.")
  flags.DEFINE_string("cases", "", "Comma-separated case names of the chosen programs to "
                      "compile, e.g. 'additive d=1024' (default: all of them).")
  flags.DEFINE_bool("resume", False, "Keep the rows of <out>/<target>.jsonl and compile only "
                    "the chosen cases it has no compiled row of (a run stopped part-way goes "
                    "on; other programs are added beside the rows already there).")
  flags.DEFINE_string("additive_seq_lens", ",".join(map(str, DEFAULT_ADDITIVE_SEQ_LENS)),
                      "Additive program: sequence lengths T.")
  flags.DEFINE_string("additive_impls", "chunked,naive",
                      f"Additive program: comma-separated forms from {', '.join(ADDITIVE_IMPLS)}.")


@dataclasses.dataclass(frozen=True)
class Options:
  """The validated command line."""
  target: "compile_targets.Target"
  programs: tuple[str, ...]
  out: str
  kernel_seq_lens: tuple[int, ...]
  additive_seq_lens: tuple[int, ...]
  additive_impls: tuple[str, ...] = ("chunked", "naive")
  resume: bool = False
  cases: tuple[str, ...] = ()  # only these case names (empty: every case of the programs)


def _int_list(name: str, raw: str) -> tuple[int, ...]:
  items = [s.strip() for s in str(raw).split(",") if s.strip()]
  if not items:
    raise ValueError(f"`--{name}` is empty.")
  try:
    values = tuple(int(s) for s in items)
  except ValueError:
    raise ValueError(f"`--{name}` must be comma-separated integers, got {raw!r}.") from None
  if any(v < 1 for v in values):
    raise ValueError(f"`--{name}`: every value must be >= 1, got {raw!r}.")
  return values


def parse_options(target: str | None, programs: str | None, out: str | None,
                  kernel_seq_lens: str, additive_seq_lens: str,
                  additive_impls: str = "chunked,naive", resume: bool = False,
                  cases: str = "") -> Options:
  """The flags' values checked; a ValueError names the first bad flag."""
  from attention_jax.measure import compile_targets  # pylint: disable=g-import-not-at-top
  targets = compile_targets.TARGETS
  if not target:
    raise ValueError(f"`--target` is required: one of {', '.join(targets)}.")
  if target not in targets:
    raise ValueError(f"`--target` must be one of {', '.join(targets)}; got {target!r}.")
  several = targets[target].devices > 1
  if programs is None:
    programs = ",".join(MESH_PROGRAMS if several else PROGRAMS)
  chosen = tuple(p.strip() for p in str(programs).split(",") if p.strip())
  known = PROGRAMS + MESH_PROGRAMS
  if not chosen:
    raise ValueError(f"`--programs` is empty; choose from {', '.join(known)}.")
  for p in chosen:
    if p not in known:
      raise ValueError(f"`--programs`: {p!r} is not one of {', '.join(known)}.")
    if p in MESH_PROGRAMS and not several:
      raise ValueError(f"`--programs`: {p!r} needs a target of several devices; {target} "
                       "is one.")
  if not out:
    raise ValueError("`--out` is required: the folder for the table and the jsonl.")
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"`--out` {out} exists and is not a folder.")
  impls = tuple(dict.fromkeys(p.strip() for p in str(additive_impls).split(",") if p.strip()))
  if not impls or any(p not in ADDITIVE_IMPLS for p in impls):
    raise ValueError(f"`--additive_impls` must name forms from {', '.join(ADDITIVE_IMPLS)}; "
                     f"got {additive_impls!r}.")
  return Options(targets[target], tuple(dict.fromkeys(chosen)), out,
                 _int_list("kernel_seq_lens", kernel_seq_lens),
                 _int_list("additive_seq_lens", additive_seq_lens), impls, bool(resume),
                 tuple(dict.fromkeys(c.strip() for c in str(cases or "").split(",")
                                     if c.strip())))


def cases_for(options: Options) -> list:
  """The `compile_cases.Case`s of the chosen programs, in their order."""
  from experiments.compile_check import cases as compile_cases  # pylint: disable=g-import-not-at-top
  cases = []
  for program in options.programs:
    if program in MESH_PROGRAMS:
      from experiments.compile_check import mesh as compile_mesh  # pylint: disable=g-import-not-at-top
      cases += compile_mesh.mesh_cases(program, options.target.devices)
    elif program == "gpu_sweep":
      cases += compile_cases.gpu_sweep_cases()
    elif program == "transformer_base":
      cases += compile_cases.transformer_base_cases()
    elif program == "kernels":
      cases += compile_cases.kernel_cases(options.kernel_seq_lens, options.target.platform)
    else:
      cases += compile_cases.additive_cases(options.additive_seq_lens, options.additive_impls)
  if options.cases:
    unknown = [name for name in options.cases if name not in {c.case for c in cases}]
    if unknown:
      raise ValueError(f"`--cases`: {', '.join(map(repr, unknown))} is not a case of "
                       f"{', '.join(options.programs)}; they are: "
                       f"{', '.join(dict.fromkeys(c.case for c in cases))}.")
    cases = [c for c in cases if c.case in options.cases]
  return cases


def kept_rows(out: str, target_name: str) -> list[dict]:
  """The rows of `<out>/<target_name>.jsonl` (none if it is missing); a
  ValueError naming `--resume` where a line is not a JSON row of that target."""
  import json  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, target_name + ".jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        raise ValueError(f"`--resume`: {path} line {number} is not JSON.") from None
      if not isinstance(row, dict) or row.get("target") != target_name:
        raise ValueError(f"`--resume`: {path} line {number} is not a row of {target_name}.")
      rows.append(row)
  return rows


def to_compile(cases: list, rows: list[dict]) -> tuple[list, list[dict]]:
  """`(cases without a compiled row in rows, rows kept)`: a case is known by
  its (program, case); its failed rows are dropped, to be compiled again."""
  done = {(r["program"], r["case"]) for r in rows if r.get("status") == "compiled"}
  todo = [c for c in cases if (c.program, c.case) not in done]
  again = {(c.program, c.case) for c in todo}
  return todo, [r for r in rows if (r["program"], r["case"]) not in again]


def run(options: Options, command: str, log: Callable[[str], None] = print) -> list[dict]:
  """Compiles every case of `options` (with `resume`, those the jsonl has no
  compiled row of, beside its rows); writes `<out>/<target>.jsonl` and `.md`
  (rewritten after each case, so a killed run keeps what it compiled)."""
  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import compile_device
  from attention_jax.measure import provenance as provenance_lib
  from experiments.compile_check import mesh as compile_mesh
  from experiments.compile_check import tables as compile_tables
  # pylint: enable=g-import-not-at-top
  target = options.target
  kept = kept_rows(options.out, target.name) if options.resume else []  # before any work
  os.makedirs(options.out, exist_ok=True)
  provenance = compile_device.row_provenance(command)
  devices = compile_device.target_devices(target)
  log(f"target {target.name}: {len(devices)} x {devices[0].device_kind} on "
      f"{compile_mesh.hosts_of(devices)} host(s); versions {provenance['versions']}")
  cases, rows = cases_for(options), []
  # Every case of the command: the report names those without a row, so that
  # a run cut part-way leaves tables that say they are part of one.
  planned = [(c.program, c.case) for c in cases]
  if options.resume:
    cases, rows = to_compile(cases, kept)
    log(f"resume: {len(rows)} row(s) kept, {len(cases)} case(s) to compile")
  for case in cases:
    compiled = (compile_mesh.compile_mesh_case(case, target, devices)
                if isinstance(case, compile_mesh.MeshCase)
                else compile_device.compile_case(case, target, devices[0]))
    row = {**compiled, provenance_lib.KEY: provenance}
    rows.append(row)
    log(f"[{row['case']}] {row['status']} in {row['compile_s']} s"
        + (f": total {compile_tables.format_gb(row.get('total_bytes'))} GB, predicted "
           f"{compile_tables.format_seconds(row.get('predicted_s'))}" if row["status"] == "compiled"
           else f": {row['error']}"))
    compile_tables.write_report(options.out, target, rows, planned=planned)
  return rows


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  from experiments.compile_check import tables as compile_tables  # pylint: disable=g-import-not-at-top
  try:
    options = parse_options(FLAGS.target, FLAGS.programs, FLAGS.out, FLAGS.kernel_seq_lens,
                            FLAGS.additive_seq_lens, FLAGS.additive_impls, FLAGS.resume,
                            FLAGS.cases)
  except ValueError as e:
    sys.exit(f"error: {e}")
  if FLAGS.report_only:
    try:
      compile_tables.report_only(options.out, options.target)
    except ValueError as e:
      sys.exit(f"error: {e}")
    print(f"wrote {os.path.join(options.out, options.target.name + '.md')}")
    return
  try:
    run(options, command="python -m experiments.compile_check.run " + " ".join(argv_given()))
  except ValueError as e:
    sys.exit(f"error: {e}")
  except (ImportError, RuntimeError) as e:
    sys.exit(f"error: {type(e).__name__}: {e} (is this the AOT environment? "
             "bash scripts/aot_env.sh)")


def argv_given() -> list[str]:
  return sys.argv[1:]


if __name__ == "__main__":
  configure_environment()
  define_flags()
  app.run(main)
