r"""Kernel launches of the `gpu` preset's training step on an H100, as the device sees them.

    .venv-aot/bin/python -m experiments.compile_check.launch_check --variant=default \
        --out=results/compile_check/launches
    .venv-aot/bin/python -m experiments.compile_check.launch_check --variant=while_loops \
        --out=results/compile_check/launches
    .venv/bin/python -m experiments.compile_check.launch_check --report_only --out=results/compile_check/launches

Compiles the `gpu_sweep` cases (`experiments.compile_check.cases`) for
the H100 as the compile check does, with XLA:GPU dumping every compiled
program (`--xla_dump_to`, a scratch folder) and the variant's XLA flags
(`VARIANTS`), and counts the step's launches from its thunk sequence
(`attention_jax.measure.thunks`): XLA:GPU forms its command buffers (CUDA
graphs) on the thunks, after the HLO passes, so the compiled HLO never shows
them. Each variant runs in its own process, since XLA reads its flags once.

Per case a row in `<out>/h100.jsonl` (replacing the same case and variant):
the compile check's HLO `kernels`, `loop_iterations`, FLOPs, bytes and
prediction, and the thunks' `launches`, `thunk_kernels`, `command_buffers`,
`host_iterations` (loop iterations the host drives) and `captured_iterations`
(those run inside a command buffer), with `predicted_launch_s`: the same
roofline plus the same assumed costs (3 us per launch, 10 us per host-driven
loop iteration: `compile_targets.TARGETS['h100']`) counted per launch instead of per
kernel. `<out>/h100.md` is the table.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from absl import app
from absl import flags

FLAGS = flags.FLAGS

# The XLA:GPU command-buffer types of jax 0.11.2's default (its dumped
# config), and that set with WHILE: loops captured whole, run on the device
# as CUDA graph conditional nodes.
DEFAULT_COMMANDS = "FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL,DYNAMIC_SLICE_FUSION,CONDITIONAL"
VARIANTS = {
    "default": "",
    "while_loops": f"--xla_gpu_enable_command_buffer={DEFAULT_COMMANDS},WHILE",
}


def define_flags() -> None:
  flags.DEFINE_string("variant", "default", f"XLA flags to compile with: {', '.join(VARIANTS)}.")
  flags.DEFINE_string("out", None, "Folder for h100.jsonl and h100.md.")
  flags.DEFINE_string("cases", "", "Comma-separated gpu_sweep case names (default: all 12).")
  flags.DEFINE_bool("report_only", False, "Rewrite <out>/h100.md from its jsonl.")


def predicted_launch_seconds(row: dict, kernel_overhead_s: float,
                             iteration_overhead_s: float) -> float:
  """The roofline of `row` plus its launches and host-driven loop iterations
  at the assumed costs."""
  return (row["roofline_s"] + row["launches"] * kernel_overhead_s
          + row["host_iterations"] * iteration_overhead_s)


def read_rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def merge(rows: list[dict], new: dict) -> list[dict]:
  """`rows` with `new` in place of the row of the same case and variant (or appended)."""
  key = (new["case"], new["variant"])
  out = [r for r in rows if (r["case"], r["variant"]) != key]
  return out + [new]


# H200 measurements of the `gpu` preset's step, jax 0.11.2's default flags, each
# beside the rows of the code it ran: (case, variant, the row's commit) -> text.
# A measurement belongs to a program, so a row compiled at another commit shows
# none until it is measured. f0c83c5's rows are the per-step step (measured at
# 25d01e3 and 2e072a6, the same model code); 26b2a20's row is the hoisted and
# unrolled step (81e5644's form, measured at 77d43da).
MEASURED = {
    ("additive d=1024", "default", "f0c83c5"):
        "21-23 ms (H200, per-step code; results/gpu_h200)",
    ("additive d=1024", "default", "26b2a20"):
        "18.6-19.0 ms (H200, 77d43da; results/gpu_h200/2026-11-27b)",
}
# The other 11 cells, measured at 5864ad7 (the same GPU program as the rows of
# 81e5644 and d4095aa: only the TPU's unroll changed since): case -> (the row's
# commit, ms); whole milliseconds where only the log line (3 decimals of a
# second) came back.
_MEASURED_5864AD7 = {
    "multiplicative d=128": ("81e5644", "17"), "multiplicative d=256": ("d4095aa", "17"),
    "multiplicative d=512": ("d4095aa", "17"), "multiplicative d=1024": ("d4095aa", "18"),
    "additive d=128": ("d4095aa", "17.6"), "additive d=256": ("d4095aa", "21.1"),
    "additive d=512": ("d4095aa", "19"),
    "scaled_multiplicative d=128": ("d4095aa", "17"),
    "scaled_multiplicative d=256": ("d4095aa", "18"),
    "scaled_multiplicative d=512": ("d4095aa", "18"),
    "scaled_multiplicative d=1024": ("d4095aa", "19.6"),
}
MEASURED.update({(case, "default", commit): f"{ms} ms (H200, 5864ad7; results/gpu_h200/2026-11-27c)"
                 for case, (commit, ms) in _MEASURED_5864AD7.items()})


def measured(row: dict) -> str:
  """The H200 measurement of the program `row` compiled, or ''."""
  from attention_jax.measure import provenance  # pylint: disable=g-import-not-at-top
  return MEASURED.get((row["case"], row["variant"], provenance.of(row)["commit"][:7]), "")


def table(rows: list[dict]) -> str:
  """The markdown table of the rows: per case, each variant's HLO kernels,
  launches, command buffers, host-driven loop iterations and the two predictions."""
  # Not at the top: importing the package starts JAX, and `configure` sets
  # XLA_FLAGS before that.
  from attention_jax.analysis import tables  # pylint: disable=g-import-not-at-top
  body = []
  order = {name: i for i, name in enumerate(VARIANTS)}
  for r in sorted(rows, key=lambda r: (r["case"].split()[0], int(r["case"].split("=")[1]),
                                       order.get(r["variant"], 99))):
    body.append([r["case"], r["variant"], f"{r['kernels']:,}", f"{r['thunk_kernels']:,}",
                 f"{r['launches']:,}", f"{r['command_buffers']:,}", f"{r['host_iterations']:,}",
                 f"{1e3 * r['predicted_s']:.1f} ms", f"{1e3 * r['predicted_launch_s']:.1f} ms",
                 measured(r)])
  sweeps = []
  for variant in VARIANTS:
    chosen = [r for r in rows if r["variant"] == variant]
    if len(chosen) == 12:
      total = sum(r["steps"] * r["predicted_launch_s"] for r in chosen) / 60
      roof = sum(r["steps"] * r["roofline_s"] for r in chosen) / 60
      sweeps.append(f"- `{variant}`: the 12 cells' training steps predicted at {total:.1f} min "
                    f"(roofline alone {roof:.1f} min).")
  head = ["case", "XLA flags", "HLO kernels", "thunk kernels", "launches", "command buffers",
          "host loop iterations", "predicted, per kernel", "predicted, per launch", "measured"]
  return (tables.markdown(head, body, align=[None, None] + ["r"] * 7 + [None])
          + ("\n" + "\n".join(sweeps) + "\n" if sweeps else ""))


def write_report(out: str, rows: list[dict]) -> None:
  with open(os.path.join(out, "h100.jsonl"), "w") as f:
    for r in rows:
      f.write(json.dumps(r, sort_keys=True) + "\n")
  with open(os.path.join(out, "h100.md"), "w") as f:
    f.write("# Launches of the `gpu` preset's step on an H100 (compiled, not run)\n\n"
            "Assumed costs: 3 us per launch (a kernel outside a command buffer, or a "
            "command buffer), 10 us per loop iteration the host drives. See README.md.\n\n")
    f.write(table(rows))


def run(variant: str, out: str, names: list[str], command: str) -> list[dict]:
  """Compiles the chosen cases with `VARIANTS[variant]`; writes the rows and table."""
  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import compile_device, compile_targets, thunks
  from experiments.compile_check import cases as compile_cases
  # pylint: enable=g-import-not-at-top
  target = compile_targets.TARGETS["h100"]
  dump = os.environ["LAUNCH_CHECK_DUMP"]
  provenance = compile_device.row_provenance(command)
  device = compile_device.target_device(target)
  cases = [c for c in compile_cases.gpu_sweep_cases() if not names or c.case in names]
  rows = read_rows(os.path.join(out, "h100.jsonl"))
  for case in cases:
    row = compile_device.compile_case(case, target, device)
    if row["status"] != "compiled":
      print(f"[{case.case}] {row['status']}: {row.get('error')}")
      continue
    count = thunks.launches_in_dump(dump, "jit_step_fn")
    row.update(variant=variant, xla_flags=VARIANTS[variant], launches=count["launches"],
               thunk_kernels=count["kernels"], command_buffers=count["command_buffers"],
               host_iterations=count["host_iterations"],
               captured_iterations=count["captured_iterations"], provenance=provenance)
    row["predicted_launch_s"] = predicted_launch_seconds(
        row, target.kernel_overhead_s, target.iteration_overhead_s)
    print(f"[{case.case}] {variant}: {row['kernels']} HLO kernels, {row['launches']} launches, "
          f"predicted {1e3 * row['predicted_launch_s']:.1f} ms (per kernel "
          f"{1e3 * row['predicted_s']:.1f} ms)")
    rows = merge(rows, row)
    write_report(out, rows)
  return rows


def case_names() -> list[str]:
  """The `gpu_sweep` case names `--cases` chooses from (the `gpu` preset's cells)."""
  from experiments.compile_check import tables as compile_tables  # pylint: disable=g-import-not-at-top
  return compile_tables.gpu_sweep_cells()


def check_flags(out: str | None, variant: str, cases: str, report_only: bool,
                known: list[str] | None = None) -> list[str]:
  """The chosen case names (empty: all); a ValueError naming the first bad
  flag, before any work: a misspelt `--cases` compiled nothing and exited 0
  (or, without the AOT environment, ended in a traceback), `--out` naming a
  file ended in a traceback, and `--report_only` on a folder without rows
  wrote empty tables."""
  if not out:
    raise ValueError("`--out` is required: the folder for h100.jsonl and h100.md.")
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"`--out` {out} exists and is not a folder.")
  if variant not in VARIANTS:
    raise ValueError(f"`--variant` must be one of {', '.join(VARIANTS)}; got {variant!r}.")
  if report_only:
    if not os.path.isfile(os.path.join(out, "h100.jsonl")):
      raise ValueError(f"`--report_only`: `--out` {out} has no h100.jsonl to report.")
    return []
  names = list(dict.fromkeys(n.strip() for n in str(cases or "").split(",") if n.strip()))
  if str(cases or "").strip() and not names:
    raise ValueError(f"`--cases` names no case ({cases!r}); leave it out for all 12.")
  known = case_names() if known is None else known
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"`--cases`: {', '.join(map(repr, unknown))} is not a gpu_sweep case; "
                     f"they are: {', '.join(known)}.")
  return names


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  try:
    names = check_flags(FLAGS.out, FLAGS.variant, FLAGS.cases, FLAGS.report_only)
  except ValueError as e:
    # The dump folder `configure` made before the flags could be read: a
    # refused command leaves nothing behind.
    if os.environ.get("LAUNCH_CHECK_DUMP"):
      shutil.rmtree(os.environ["LAUNCH_CHECK_DUMP"], ignore_errors=True)
    sys.exit(f"error: {e}")
  if FLAGS.report_only:
    write_report(FLAGS.out, read_rows(os.path.join(FLAGS.out, "h100.jsonl")))
    return
  os.makedirs(FLAGS.out, exist_ok=True)
  run(FLAGS.variant, FLAGS.out, names, "python -m experiments.compile_check.launch_check " +
      " ".join(sys.argv[1:]))


def configure(variant: str) -> None:
  """XLA_FLAGS for `variant` with a scratch dump folder, before jax starts."""
  from experiments.compile_check import run as compile_check  # pylint: disable=g-import-not-at-top
  compile_check.configure_environment()
  dump = tempfile.mkdtemp(prefix="launch_check_")
  os.environ["LAUNCH_CHECK_DUMP"] = dump
  os.environ["XLA_FLAGS"] = " ".join(
      f for f in (os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={dump}",
                  VARIANTS.get(variant, "")) if f)


if __name__ == "__main__":
  define_flags()
  variant = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--variant=")),
                 "default")
  if not any(a == "--report_only" for a in sys.argv[1:]):
    configure(variant)
  app.run(main)
