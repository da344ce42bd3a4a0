"""Flags and plumbing shared by the absl drivers `train`, `ablation` and `benchmark`.

Every field of a driver's settings dataclass (`ExperimentConfig`, the
benchmark's `Settings`) is a flag of the same name whose default is "take it
from the preset", its help in the field's metadata (`config.flag_field`); a
flag given on the command line overrides the preset (`define_field_flags`,
`overrides`). An invalid value stops the driver with one line, before any work.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import signal
import sys
import types
import typing

from absl import flags
from absl import logging
import jax
import numpy as np

from attention_jax.sweep import config as config_lib
from attention_jax.sweep import host_memory
from attention_jax.training import interrupts
from attention_jax.training import metrics_log
from attention_jax.training import placement
import experiments

FLAGS = flags.FLAGS
experiments.add_study_presets()  # `--preset` names the studies' presets too

# The exit status of a driver stopped by its time budget (`--max_minutes`)
# with everything kept: the same command continues. EX_TEMPFAIL of
# sysexits.h, so that a script tells a stopped run from a complete one (0),
# a failed run or a bad call (1) and a signal (143, 130).
EXIT_STOPPED = 75

# Fields the individual drivers define themselves.
_OWN = ("arms", "dims")


def define_flags(skip: tuple[str, ...] = ()) -> None:
  """The command line of a training driver: --preset, --workdir, a flag per
  `ExperimentConfig` field (but `arms`, `dims` and `skip`) and the multi-host
  flags."""
  flags.DEFINE_enum("preset", "quick", list(config_lib.PRESETS),
                    "Starting values for every field; explicit flags override them.")
  flags.DEFINE_string("workdir", None, "Output folder (results, checkpoints, plots).")
  flags.DEFINE_bool("show_config", False,
                    "Print every setting the run would use (the preset's values with the "
                    "flags given over them, each marked with where it comes from) and exit; "
                    "needs no --workdir. --helpfull shows the dataclass defaults instead.")
  define_field_flags(config_lib.ExperimentConfig, skip=_OWN + tuple(skip))
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0; with --num_processes and --process_id "
                      "starts jax.distributed for multi-host data parallelism. 'auto': "
                      "jax.distributed.initialize() reads them from the scheduler "
                      "(SLURM, Open MPI, Kubernetes, Cloud TPU; docs/cluster.md), with no "
                      "--num_processes or --process_id.")
  flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
  flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
  flags.DEFINE_list("import", [], "Modules to import before the flags are read, e.g. "
                    "--import=my_scores: a module that `registry.register`s a score of its "
                    "own, which --arms can then name (importable from the current folder or "
                    "PYTHONPATH; --workers' processes import it too).")
  flags.DEFINE_enum("mesh", "auto", list(placement.SCHEMES),
                    "How several devices share a run: 'members' (each device its own "
                    "members, the batch whole on each: no communication in a step; the "
                    "members must split over the devices), 'data' (each batch split over "
                    "every device, every member on each: gradients all-reduced), "
                    "'members,data' (the members over gcd(members, devices) groups, each "
                    "batch over the devices of a group), 'auto' (members when there are at "
                    "least as many members as devices, else members,data). Ignored on one "
                    "device.")


def _kind(hint) -> type:
  """The type a field annotated `hint` holds, `X | None` read as X."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
    return args[0]
  return hint


def item_type(cls, name: str) -> type | None:
  """The item type of `cls`'s tuple field `name` (`tuple[int, ...]`: int);
  None for a field that is no tuple."""
  hint = _kind(typing.get_type_hints(cls)[name])
  return typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else None


def define_field_flags(cls, skip: tuple[str, ...] = (),
                       flag_values: flags.FlagValues = FLAGS) -> None:
  """A flag per field of the dataclass `cls` (but `skip`), named as the field,
  its help from the field's metadata (`help`, with the dataclass default where
  there is one) and its default None ("take it from the preset"): a boolean,
  integer or float flag for such a field (or one that may be None), an enum for a field
  whose metadata lists `choices`, else a string (a tuple field's is
  comma-separated, `parse_list`), in `flag_values`."""
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    if field.name in skip:
      continue
    help_text = field.metadata["help"]
    if field.default is not dataclasses.MISSING:
      help_text += f" [dataclass default: {field.default!r}]"
    kind = _kind(hints[field.name])
    if field.metadata.get("choices"):
      flags.DEFINE_enum(field.name, None, list(field.metadata["choices"]), help_text,
                        flag_values=flag_values)
    elif kind is bool:
      flags.DEFINE_boolean(field.name, None, help_text, flag_values=flag_values)
    elif kind is int:
      flags.DEFINE_integer(field.name, None, help_text, flag_values=flag_values)
    elif kind is float:
      flags.DEFINE_float(field.name, None, help_text, flag_values=flag_values)
    elif kind is str or typing.get_origin(kind) is tuple:
      flags.DEFINE_string(field.name, None, help_text, flag_values=flag_values)
    else:
      raise TypeError(f"{cls.__name__}.{field.name}: no flag for a field of type {kind}.")


def parse_fields(cls, values: dict) -> dict:
  """`values` (field of `cls` -> value) with the text given for a tuple field
  parsed into its tuple (`parse_list`); everything else as given."""
  out = {}
  for name, value in values.items():
    cast = item_type(cls, name) if isinstance(value, str) else None
    out[name] = parse_list(name, value, cast) if cast is not None else value
  return out


def overrides(cls=config_lib.ExperimentConfig, extra: dict | None = None) -> dict:
  """The fields of `cls` given explicitly on the command line, and `extra`
  (the driver's own flags), a tuple field given as text parsed (`parse_fields`):
  a ValueError names the flag."""
  out = {}
  for field in dataclasses.fields(cls):
    if field.name in FLAGS and FLAGS[field.name].present:
      out[field.name] = FLAGS[field.name].value
  out.update(extra or {})
  return parse_fields(cls, out)


def show_config(cfg, preset: str, given: dict) -> str:
  """The resolved settings of `cfg`, a line each: `--field=value` and where
  the value comes from (a flag, the preset, or the dataclass default); a
  field that `--members` varies shows every member's value, not the first
  member's (which the config holds)."""
  from_preset = config_lib.PRESETS[preset]
  members = dict(cfg.member_axes())
  lines = [f"# the settings of --preset={preset} with the flags given; each line is a flag"]
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    text = ",".join(map(str, value)) if isinstance(value, tuple) else value
    if field.name in members:
      values = ",".join(map(repr, members[field.name]))
      lines.append(f"--{field.name}={values}  # --members: one member per value, each "
                   "trained with every seed")
      continue
    source = ("flag" if field.name in given else
              "preset" if field.name in from_preset else "default")
    lines.append(f"--{field.name}={text}  # {source}")
  return "\n".join(lines)


def build_config(extra: dict | None = None, sweep: tuple[str, ...] = ()):
  """Preset + explicit flags, and the parsed `--sweep` axes (every grid point
  checked); exits with one clear line on a bad value, before any work.

  Returns:
    `(config, axes)`: axes as `config.parse_axis` gives them.
  """
  try:
    from attention_jax.sweep import workers  # pylint: disable=g-import-not-at-top
    workers.import_modules(FLAGS["import"].value)
    given = overrides(extra=extra)
    conflict = config_lib.members_conflict(given)
    if conflict:
      raise ValueError(conflict)
    if FLAGS.show_config:
      cfg = config_lib.from_preset(FLAGS.preset, **given)
      config_lib.check_family(cfg.model, given)
      try:
        print(show_config(cfg, FLAGS.preset, given), flush=True)
      except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      sys.exit(0)
    if not FLAGS.workdir:
      raise ValueError("`--workdir` is required.")
    cfg = config_lib.from_preset(FLAGS.preset, **given)
    config_lib.check_family(cfg.model, given)
    axes = tuple(config_lib.parse_axis(text) for text in sweep)
    for name, _ in axes:
      if name in given:
        raise ValueError(f"`{name}` is given both as --{name} and in --sweep; give one.")
    config_lib.grid(cfg, axes)
    check_utf8_path("workdir", FLAGS.workdir)  # its checkpoints' library needs UTF-8
    check_output_dir("workdir", FLAGS.workdir)
    return cfg, axes
  except (ValueError, TypeError) as e:
    sys.exit(f"error: {e}")


def check_output_dir(flag: str, path: str) -> None:
  """Raises a ValueError naming `--flag` unless `path` is (or can become) a
  writable folder. Creates nothing, so a refused run leaves nothing behind."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"`--{flag}` {path} exists and is not a folder.")
  probe = os.path.abspath(path)
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise ValueError(f"`--{flag}` {path}: {probe} is a file, so the folder cannot be made.")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise ValueError(f"`--{flag}` {path}: no permission to write in {probe}.")


def check_utf8_path(flag: str, path: str) -> None:
  """Raises a ValueError naming `--flag` unless `path`, made absolute (the
  current folder's name counts too), is UTF-8. Python keeps a name of other
  bytes as lone surrogates (b'\\xff' is '\\udcff'), which the file system
  takes, but TensorStore, which writes Orbax's checkpoints, needs UTF-8: such
  a workdir trained, then failed at its first checkpoint with a 141-line
  traceback, and again on every re-run."""
  full = os.path.abspath(path)
  try:
    full.encode("utf-8")
  except UnicodeEncodeError:
    raise ValueError(f"`--{flag}` {os.fsencode(full)!r} is not UTF-8, which the checkpoint "
                     "library cannot write; give a folder whose path is UTF-8.") from None


def _bool(text: str) -> bool:
  if text.lower() in ("true", "1", "yes"):
    return True
  if text.lower() in ("false", "0", "no"):
    return False
  raise ValueError(text)


def parse_list(name: str, value: str, cast: type = str) -> tuple:
  """The comma-separated text of flag `--name` as a tuple of `cast` (a bool
  from true/false, 1/0, yes/no); a ValueError names the flag."""
  parse = _bool if cast is bool else cast
  try:
    items = tuple(parse(v.strip()) for v in str(value).split(",") if v.strip())
  except ValueError:
    raise ValueError(f"`--{name}` must be a comma-separated list of {cast.__name__}, "
                     f"got {value!r}.") from None
  if not items:
    raise ValueError(f"`--{name}` is empty.")
  return items


def maybe_start_distributed() -> None:
  """Starts `jax.distributed` as the flags ask: with `auto`, JAX's own
  cluster detection (`jax.distributed.initialize()` without arguments:
  SLURM's, Open MPI's, Kubernetes' and Cloud TPU's environments); a
  scheduler it does not recognise is one line, not a hang."""
  from attention_jax.training import multihost  # pylint: disable=g-import-not-at-top
  problem = multihost.distributed_problem(FLAGS.coordinator_address, FLAGS.num_processes,
                                          FLAGS.process_id)
  if problem:
    sys.exit(f"error: {problem}")
  if FLAGS.coordinator_address == multihost.AUTO:
    try:
      jax.distributed.initialize()
    except ValueError as e:  # jax found no scheduler's environment to read
      sys.exit(f"error: `--coordinator_address=auto`: {e} (jax found no SLURM, Open MPI, "
               "Kubernetes or Cloud TPU environment); give --coordinator_address=HOST:PORT "
               "--num_processes and --process_id instead.")
    return
  given = [FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id]
  if any(v is not None for v in given):
    if any(v is None for v in given):
      sys.exit("error: `--coordinator_address`, `--num_processes` and `--process_id` "
               "must be given together.")
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                               FLAGS.process_id)


_REPORT_FILES = (".md", ".jsonl", ".png")


def report_files(workdir: str) -> dict[str, tuple[int, int, int]]:
  """The table, rows and plots in `workdir`, each with what tells a file
  rewritten since (inode, modification time in ns, size: every report is
  written atomically, as a new file); {} where the folder does not exist."""
  if not os.path.isdir(workdir):
    return {}
  out = {}
  for name in os.listdir(workdir):
    if name.endswith(_REPORT_FILES):
      try:
        stat = os.stat(os.path.join(workdir, name))
      except FileNotFoundError:
        continue
      out[name] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
  return out


def written(workdir: str, before: dict[str, tuple[int, int, int]] | None = None) -> str:
  """The last line of a finished sweep: the table, rows and plots it wrote
  in `workdir`, those that are new or rewritten since `before`
  (`report_files` as it started; a plot left by an earlier command, of
  other runs, is no file of this one), and where TensorBoard reads the
  runs' event files."""
  now = report_files(workdir)
  names = sorted(n for n, seen in now.items() if before is None or before.get(n) != seen)
  line = f"wrote {', '.join(names) or 'no report'} in {workdir}"
  boards = glob.glob(os.path.join(glob.escape(workdir), "runs", "*", metrics_log.FOLDER))
  boards += glob.glob(os.path.join(glob.escape(workdir), "*", "runs", "*", metrics_log.FOLDER))
  if boards:
    line += (f"; TensorBoard: tensorboard --logdir={workdir} (each run's "
             f"{metrics_log.FOLDER}/ folder)")
  return line


def shard_of(spec: str, report_only: bool) -> tuple[int, int] | None:
  """`--shard` as (index, count) (`sweep.shards.parse`), checked with the
  flags it cannot go with; a ValueError of one line, before any work or
  connection."""
  from attention_jax.sweep import shards  # pylint: disable=g-import-not-at-top
  shard = shards.parse(spec, os.environ)
  if shard is None:
    return None
  if report_only:
    raise ValueError("`--shard` trains a share of the sweep; `--report_only` trains nothing: "
                     "give one of them.")
  if FLAGS.coordinator_address is not None or FLAGS.num_processes is not None:
    raise ValueError("`--shard` shares a sweep among independent drivers; a run over several "
                     "processes (`--coordinator_address`) trains the whole sweep together: "
                     "give one of them.")
  return shard


def run_sweep(argv, extra: dict, sweep: tuple[str, ...] = (), report_only: bool = False,
              shard: str = "") -> None:
  """Builds the config, starts jax.distributed if asked, runs (or with
  `report_only` only rewrites the reports; with `shard` its share of the
  runs, `sweep.shards`), prints the table; exits with `EXIT_STOPPED` where
  `--max_minutes` stopped the sweep (process 0 says so: the other processes
  of a multi-host run end with 0 either way)."""
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  interrupts.install()  # SIGTERM, Ctrl-C: checkpoint after the step, exit 143 / 130
  host_memory.keep_freed_memory()  # before JAX's CPU client starts (its docstring says why)
  try:
    share = shard_of(shard, report_only)
  except ValueError as e:
    sys.exit(f"error: {e}")
  cfg, axes = build_config(extra, sweep)
  from attention_jax.analysis import reports  # heavy imports only after the checks
  from attention_jax.sweep import runner
  from attention_jax.sweep import workers

  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO

  before = report_files(FLAGS.workdir)
  try:
    if report_only:
      table = runner.report_only(cfg, FLAGS.workdir, axes, report=reports.write)
      signum = interrupts.requested()
      if signum is not None:  # a SIGTERM or Ctrl-C while writing: said, and not exit 0
        print(f"{signal.Signals(signum).name} during --report_only: each report file is "
              "replaced whole, but some may be older than others; re-run it", file=sys.stderr)
        sys.exit(interrupts.Interrupted(signum).exit_code)
      print(table)
      print(written(FLAGS.workdir, before))
      return
    # What can be refused without a backend is refused before connecting:
    # `jax.distributed` waits minutes for the other processes, then fails
    # with a C++ stack, before the refusal after it was reached.
    workers.check_before_connecting(cfg, FLAGS.num_processes)
    runner.check_workdir(runner.Plan.of(cfg, FLAGS.workdir, axes, reports.write))
    maybe_start_distributed()
    groups, group_memory = workers.worker_groups(cfg, FLAGS.mesh)
    table = runner.run(cfg, FLAGS.workdir, report=reports.write,
                       mesh=None if groups else workers.device_mesh(cfg, FLAGS.mesh), axes=axes,
                       worker_environments=groups, mesh_scheme=FLAGS.mesh,
                       group_memory=group_memory, shard=share)
  except interrupts.Interrupted as e:  # the trainer said where it stopped
    sys.exit(e.exit_code)
  except (ValueError, workers.RunsFailed) as e:
    sys.exit(f"error: {e}")
  except OSError as e:  # a full disk, a folder made read-only mid-run: one line, no traceback
    sys.exit(f"error: {FLAGS.workdir}: {e.strerror or e} ({e.filename or 'while writing'})")
  if table is None and jax.process_index() == 0:  # the time budget stopped it (said above)
    sys.exit(EXIT_STOPPED)
  if table is not None:
    print("\n" + table)
    print(written(FLAGS.workdir, before))

