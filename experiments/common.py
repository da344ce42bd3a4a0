"""Flags and plumbing shared by the absl drivers `train` and `ablation`.

Every field of `ExperimentConfig` is a flag of the same name whose default is
"take it from the preset"; a flag given on the command line overrides the
preset. An invalid value stops the driver with one line, before any work.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing

from absl import flags
from absl import logging
import jax
import numpy as np

from attention_jax.training import config as config_lib
from attention_jax.training import interrupts

FLAGS = flags.FLAGS

_DEFAULTS = config_lib.ExperimentConfig()

# Fields the individual drivers define themselves.
_OWN = ("arms", "dims")


def define_flags(skip: tuple[str, ...] = ()) -> None:
  flags.DEFINE_enum("preset", "quick", list(config_lib.PRESETS),
                    "Starting values for every field; explicit flags override them.")
  flags.DEFINE_string("workdir", None, "Output folder (results, checkpoints, plots).")
  hints = typing.get_type_hints(config_lib.ExperimentConfig)
  for field in dataclasses.fields(config_lib.ExperimentConfig):
    if field.name in _OWN or field.name in skip:
      continue
    help_text = (f"{field.metadata['help']} [dataclass default: "
                 f"{getattr(_DEFAULTS, field.name)!r}]")
    kind = hints[field.name]
    if kind is int:
      flags.DEFINE_integer(field.name, None, help_text)
    elif kind is float:
      flags.DEFINE_float(field.name, None, help_text)
    else:
      flags.DEFINE_string(field.name, None, help_text)
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0; with --num_processes and --process_id "
                      "starts jax.distributed for multi-host data parallelism.")
  flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
  flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")


def overrides(extra: dict | None = None) -> dict:
  """The fields given explicitly on the command line."""
  out = {}
  for field in dataclasses.fields(config_lib.ExperimentConfig):
    if field.name in FLAGS and FLAGS[field.name].present:
      out[field.name] = FLAGS[field.name].value
  out.update(extra or {})
  return out


def build_config(extra: dict | None = None, sweep: tuple[str, ...] = ()):
  """Preset + explicit flags, and the parsed `--sweep` axes (every grid point
  checked); exits with one clear line on a bad value, before any work.

  Returns:
    `(config, axes)`: axes as `config.parse_axis` gives them.
  """
  try:
    if not FLAGS.workdir:
      raise ValueError("`--workdir` is required.")
    given = overrides(extra)
    cfg = config_lib.from_preset(FLAGS.preset, **given)
    config_lib.check_family(cfg.model, given)
    axes = tuple(config_lib.parse_axis(text) for text in sweep)
    for name, _ in axes:
      if name in given:
        raise ValueError(f"`{name}` is given both as --{name} and in --sweep; give one.")
    config_lib.grid(cfg, axes)
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


def parse_list(name: str, value: str, cast=str) -> tuple:
  try:
    items = tuple(cast(v.strip()) for v in value.split(",") if v.strip())
  except ValueError:
    sys.exit(f"error: `--{name}` must be a comma-separated list of {cast.__name__}, got {value!r}.")
  if not items:
    sys.exit(f"error: `--{name}` is empty.")
  return items


def maybe_start_distributed() -> None:
  given = [FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id]
  if any(v is not None for v in given):
    if any(v is None for v in given):
      sys.exit("error: `--coordinator_address`, `--num_processes` and `--process_id` "
               "must be given together.")
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                               FLAGS.process_id)


def data_mesh():
  """A 1-D 'data' mesh over every device, or None on a single device."""
  devices = jax.devices()
  if len(devices) == 1:
    return None
  return jax.sharding.Mesh(np.asarray(devices), ("data",))


def run_sweep(argv, extra: dict, sweep: tuple[str, ...] = (), report_only: bool = False) -> None:
  """Builds the config, starts jax.distributed if asked, runs (or with
  `report_only` only rewrites the reports), prints the table."""
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  interrupts.install()  # SIGTERM, Ctrl-C: checkpoint after the step, exit 143 / 130
  cfg, axes = build_config(extra, sweep)
  from attention_jax.training import sweep  # heavy imports only after the checks

  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO

  try:
    if report_only:
      print(sweep.report_only(cfg, FLAGS.workdir, axes))
      return
    maybe_start_distributed()
    table = sweep.run(cfg, FLAGS.workdir, mesh=data_mesh(), axes=axes)
  except interrupts.Interrupted as e:  # the trainer said where it stopped
    sys.exit(e.exit_code)
  except ValueError as e:
    sys.exit(f"error: {e}")
  except OSError as e:  # a full disk, a folder made read-only mid-run: one line, no traceback
    sys.exit(f"error: {FLAGS.workdir}: {e.strerror or e} ({e.filename or 'while writing'})")
  if table is not None:
    print("\n" + table)
