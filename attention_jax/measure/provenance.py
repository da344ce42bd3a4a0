"""Where a row of results came from: commit, library versions, device, command.

A run's numbers repeat to the last digit only on the same machine type with
the same library versions; another CPU model gives the same trajectory to
about 1e-3 but not the same digits (docs/reproducibility.md). So every row of
`results.jsonl` (ablation and sweep runs, through each run's `result.json`)
and of `benchmark.jsonl` carries, under the key `provenance`:

  commit       the environment variable ATTENTION_JAX_COMMIT where it is set
               (a copy of the tree sent to another machine: without `.git`,
               or with a `.git` of an older commit plus the changes since,
               which git would call that commit, dirty); else `git rev-parse
               HEAD` of the source tree the package was imported from;
               "unknown" outside a git checkout
  dirty        whether tracked files differed from that commit (null: unknown)
  versions     python, jax, jaxlib, flax, optax, orbax-checkpoint (null: not
               installed)
  platform     `jax.default_backend()`: cpu, gpu or tpu
  device_kind  `jax.devices()[0].device_kind`; on CPU the CPU model
               (`model name` of /proc/cpuinfo), which is what decides the digits
  command      the command line of the process, `python -m module flags...`
  xla_flags    the XLA_FLAGS the process ran under ("" if none): XLA:CPU's
               thread count can change the digits (`--workers` processes run
               on one core each, `--workers=1` trains in the driver on every core)

The fields are gathered once per process (`fields`); `record` and the parsers
are pure. They are not part of a run's settings: a workdir made before they
existed resumes, and rows without them load as before.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import platform as platform_lib
import shlex
import subprocess
import sys
from typing import Any, Mapping, Sequence

KEY = "provenance"
UNKNOWN = "unknown"
DISTRIBUTIONS = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
COMMIT_VARIABLE = "ATTENTION_JAX_COMMIT"
_DIRTY_SUFFIX = "-dirty"


def record(*, commit: str | None, dirty: bool | None, versions: Mapping[str, str | None],
           platform: str | None, device_kind: str | None,
           command: str | None, xla_flags: str | None = None) -> dict[str, Any]:
  """The `provenance` value of a row (a new dict; `commit` None -> "unknown")."""
  return {"commit": commit or UNKNOWN, "dirty": dirty, "versions": dict(versions),
          "platform": platform, "device_kind": device_kind, "command": command,
          "xla_flags": xla_flags}


def device_name(platform: str, device_kind: str, cpu: str | None) -> str:
  """The device kind, except on CPU where JAX says only "cpu": the CPU model."""
  if platform == "cpu" and cpu:
    return cpu
  return device_kind


def command_line(argv: Sequence[str], main_module: str | None) -> str:
  """`argv` as a shell command; `python -m MODULE ...` when run as a module."""
  if main_module:
    module = main_module.removesuffix(".__main__")
    return shlex.join(["python", "-m", module, *argv[1:]])
  if argv and argv[0] == "-c":
    return shlex.join(["python", "-c", "...", *argv[1:]])
  return shlex.join(["python", *argv]) if argv else "python"


def parse_commit(text: str) -> tuple[str | None, bool | None]:
  """(commit, dirty) of an ATTENTION_JAX_COMMIT value: `SHA` or `SHA-dirty`
  (dirty unknown for a bare SHA: it may stand for a changed tree)."""
  text = text.strip()
  if not text:
    return None, None
  if text.endswith(_DIRTY_SUFFIX):
    return text[:-len(_DIRTY_SUFFIX)] or None, True
  return text, None


def git_state(root: str) -> tuple[str | None, bool | None]:
  """(HEAD commit, whether tracked files differ from it) of the checkout
  whose top folder is `root`; (None, None) when `root` is not the top of a
  git checkout (an installed copy, a tree without `.git`) or git is missing."""

  def git(*args):
    try:
      return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                            check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
      return None

  top = git("rev-parse", "--show-toplevel")
  if top is None or os.path.realpath(top.strip()) != os.path.realpath(root):
    return None, None  # e.g. site-packages inside some other checkout
  commit = git("rev-parse", "HEAD")
  status = git("status", "--porcelain", "--untracked-files=no")
  return ((commit.strip() or None) if commit else None,
          None if status is None else bool(status.strip()))


def versions(names: Sequence[str] = DISTRIBUTIONS) -> dict[str, str | None]:
  """Python's and the installed versions of the distributions `names` (None:
  not installed)."""
  out: dict[str, str | None] = {"python": platform_lib.python_version()}
  for name in names:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def _source_root() -> str:
  """The folder holding the `attention_jax` package that is running."""
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main_module() -> str | None:
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  return getattr(spec, "name", None)


def collect() -> dict[str, Any]:
  """The provenance of this process, gathered now (`fields` caches it)."""
  import jax  # pylint: disable=g-import-not-at-top
  from attention_jax.measure import benchmarking  # pylint: disable=g-import-not-at-top

  commit, dirty = parse_commit(os.environ.get(COMMIT_VARIABLE, ""))
  if commit is None:
    commit, dirty = git_state(_source_root())
  backend = jax.default_backend()
  cpu = (benchmarking.cpu_model(benchmarking.read_cpuinfo())
         or platform_lib.processor() or None)
  return record(commit=commit, dirty=dirty, versions=versions(), platform=backend,
                device_kind=device_name(backend, jax.devices()[0].device_kind, cpu),
                command=command_line(sys.argv, _main_module()),
                xla_flags=os.environ.get("XLA_FLAGS", ""))


@functools.cache
def _cached() -> dict[str, Any]:
  return collect()


def fields() -> dict[str, Any]:
  """This process's provenance, gathered on the first call (a copy each time)."""
  return copy.deepcopy(_cached())


def stamp(row: Mapping[str, Any]) -> dict[str, Any]:
  """`row` with this process's provenance under `KEY`."""
  return {**row, KEY: fields()}


def of(row: Mapping[str, Any]) -> dict[str, Any]:
  """The provenance a row records; for a row written before rows carried one,
  every field unknown (commit "unknown", the rest null)."""
  recorded = row.get(KEY)
  if isinstance(recorded, Mapping):
    return dict(recorded)
  return record(commit=None, dirty=None, versions={}, platform=None, device_kind=None,
                command=None)
