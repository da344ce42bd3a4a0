"""Where a row of results came from: the one schema of a row's provenance.

A run's numbers repeat to the last digit only on the same machine type with
the same library versions; another CPU model gives the same trajectory to
about 1e-3 but not the same digits (docs/reproducibility.md). So every row a
study writes carries, under the key `provenance` (`KEY`), the same record:
the training and sweep rows (each run's `result.json`, and `results.jsonl`
built from them), the kernel benchmark's rows (`benchmark.jsonl`,
`tiles.jsonl`), the compile check's rows, the CPU-efficiency rows, the
init-logits rows, the sweep calibration's json and the threshold report's
`analysed_at`. Its fields, in this order (`FIELDS`):

  commit        the environment variable ATTENTION_JAX_COMMIT where it is set
                (a copy of the tree sent to another machine: without `.git`,
                or with a `.git` of an older commit plus the changes since,
                which git would call that commit, dirty); else `git rev-parse
                HEAD` of the source tree the package was imported from;
                "unknown" outside a git checkout
  dirty         whether tracked files differed from that commit (null: unknown)
  versions      Python's and the installed versions of `DISTRIBUTIONS`, plus
                those a writer adds (the compile check: libtpu, the CUDA
                plugin, cuDNN); null: not installed
  platform      `jax.default_backend()`: cpu, gpu or tpu
  device_kind   `jax.devices()[0].device_kind`; on CPU the CPU model
                (`model name` of /proc/cpuinfo), which is what decides the digits
  device_count  `jax.device_count()`
  cpu           the host's CPU model, whatever the device: beside a GPU or a
                TPU the host still times the input pipeline and compiles
  cpu_cores     the cores this process may run on (its CPU affinity) when the
                record was gathered: a `--workers` process runs on one
  command       the command line of the process, `python -m module flags...`
                (or the one a driver names, `fields(command=...)`); null where
                a writer leaves it out since it names folders of the machine
                (the threshold report's analysis)
  xla_flags     the XLA_FLAGS the process ran under ("" if none): XLA:CPU's
                thread count can change the digits (`--workers` processes run
                on one core each, `--workers=1` trains in the driver on every core)
  date          when the record was gathered, UTC, `2026-11-25T14:06:24Z`

The record is gathered once per process (`fields`), as the process starts
its work, so a run hours long records the commit it started from. `machine`
gives the same facts under the names the kernel benchmark's and the CPU
study's rows also keep at their top level. `of` reads the record back from any
row committed so far, including the older layouts that kept some of these
fields at a row's top level. The fields are not part of a run's settings: a
workdir made before they existed resumes, and rows without them load as before.
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
import time
from typing import Any, Mapping, Sequence

KEY = "provenance"
UNKNOWN = "unknown"
DISTRIBUTIONS = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
COMMIT_VARIABLE = "ATTENTION_JAX_COMMIT"
FIELDS = ("commit", "dirty", "versions", "platform", "device_kind", "device_count", "cpu",
          "cpu_cores", "command", "xla_flags", "date")
# The type of each field in a record this process gathers (`problems`).
TYPES = {"commit": str, "dirty": (bool, type(None)), "versions": dict, "platform": str,
         "device_kind": str, "device_count": int, "cpu": (str, type(None)), "cpu_cores": int,
         "command": (str, type(None)), "xla_flags": str, "date": str}
DATE_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_DIRTY_SUFFIX = "-dirty"
# How a commit was written where it stood at a row's top level (the compile check's rows).
_FLAT_DIRTY_SUFFIX = "+dirty"


def record(*, commit: str | None, dirty: bool | None, versions: Mapping[str, str | None],
           platform: str | None, device_kind: str | None, command: str | None,
           xla_flags: str | None = None, device_count: int | None = None,
           cpu: str | None = None, cpu_cores: int | None = None,
           date: str | None = None) -> dict[str, Any]:
  """The `provenance` value of a row, every field of `FIELDS` in order (a new
  dict; `commit` None -> "unknown", any other field None: not known)."""
  return {"commit": commit or UNKNOWN, "dirty": dirty, "versions": dict(versions),
          "platform": platform, "device_kind": device_kind, "device_count": device_count,
          "cpu": cpu, "cpu_cores": cpu_cores, "command": command, "xla_flags": xla_flags,
          "date": date}


def _of_type(value: Any, kind) -> bool:
  """Whether `value` is of `kind` (a type or a tuple of types), a bool
  counting as a number only where `kind` names bool."""
  if isinstance(value, bool):
    return bool in (kind if isinstance(kind, tuple) else (kind,))
  return isinstance(value, kind)


def problems(rec: Mapping[str, Any]) -> list[str]:
  """What in `rec` is not a record as `fields` gathers it: each field of
  `FIELDS` missing or of another type than `TYPES` says, a commit that is
  not known, versions without Python's and jax's, a date not in
  `DATE_FORMAT`. Empty when it is one."""
  found = []
  for name in FIELDS:
    if name not in rec:
      found.append(f"`{name}` is missing")
    elif not _of_type(rec[name], TYPES[name]):
      found.append(f"`{name}` is {rec[name]!r}, not {TYPES[name]}")
  if found:
    return found
  if not rec["commit"] or rec["commit"] == UNKNOWN:
    found.append("`commit` is not known")
  if not (rec["versions"].get("python") and rec["versions"].get("jax")):
    found.append(f"`versions` {rec['versions']} lacks python's or jax's")
  try:
    time.strptime(rec["date"], DATE_FORMAT)
  except ValueError:
    found.append(f"`date` {rec['date']!r} is not {DATE_FORMAT}")
  return found


def device_name(platform: str, device_kind: str, cpu: str | None) -> str:
  """The device kind, except on CPU where JAX says only "cpu": the CPU model."""
  if platform == "cpu" and cpu:
    return cpu
  return device_kind


def jax_device_kind(rec: Mapping[str, Any]) -> str | None:
  """What `jax.devices()[0].device_kind` said when `rec` was gathered: "cpu" on
  CPU (where the record names the CPU model instead), else the record's."""
  return "cpu" if rec.get("platform") == "cpu" else rec.get("device_kind")


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


def commit_label(rec: Mapping[str, Any]) -> str:
  """The commit of `rec` as one word: `SHA`, or `SHA+dirty` where tracked
  files differed from it (as the compile check's reports name it)."""
  return str(rec.get("commit")) + (_FLAT_DIRTY_SUFFIX if rec.get("dirty") else "")


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


def cpu_model(cpuinfo: str) -> str | None:
  """The first `model name` of a /proc/cpuinfo text, else None."""
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(":")
    if sep and key.strip() == "model name" and value.strip():
      return value.strip()
  return None


def read_cpuinfo() -> str:
  """/proc/cpuinfo's text; "" where there is none (not Linux)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      return f.read()
  except OSError:
    return ""


def cpu_name() -> str | None:
  """This host's CPU model; where /proc/cpuinfo names none, what Python says
  of the processor or, last, of the machine (None: nothing)."""
  return (cpu_model(read_cpuinfo()) or platform_lib.processor() or platform_lib.machine()
          or None)


def usable_cores() -> int:
  """How many cores this process may run on (its CPU affinity; every core
  where the system has no affinity)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def utc_date(seconds: float) -> str:
  """`seconds` since the epoch as `DATE_FORMAT` (UTC)."""
  return time.strftime(DATE_FORMAT, time.gmtime(seconds))


def _source_root() -> str:
  """The folder holding the `attention_jax` package that is running."""
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main_module() -> str | None:
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  return getattr(spec, "name", None)


def collect() -> dict[str, Any]:
  """The provenance of this process, gathered now (`fields` caches it)."""
  import jax  # pylint: disable=g-import-not-at-top

  commit, dirty = parse_commit(os.environ.get(COMMIT_VARIABLE, ""))
  if commit is None:
    commit, dirty = git_state(_source_root())
  backend = jax.default_backend()
  cpu = cpu_name()
  return record(commit=commit, dirty=dirty, versions=versions(), platform=backend,
                device_kind=device_name(backend, jax.devices()[0].device_kind, cpu),
                device_count=jax.device_count(), cpu=cpu, cpu_cores=usable_cores(),
                command=command_line(sys.argv, _main_module()),
                xla_flags=os.environ.get("XLA_FLAGS", ""), date=utc_date(time.time()))


@functools.cache
def _cached() -> dict[str, Any]:
  return collect()


def fields(extra_distributions: Sequence[str] = (), *,
           command: str | None = None) -> dict[str, Any]:
  """This process's provenance, gathered on the first call (a copy each
  time); with the versions of `extra_distributions` too (those a writer's
  numbers also depend on), and `command` in place of the process's own
  command line where the writer names it."""
  rec = copy.deepcopy(_cached())
  extra = [name for name in extra_distributions if name not in rec["versions"]]
  rec["versions"].update(versions(extra) if extra else {})
  if command is not None:
    rec["command"] = command
  return rec


def stamp(row: Mapping[str, Any]) -> dict[str, Any]:
  """`row` with this process's provenance under `KEY`."""
  return {**row, KEY: fields()}


def machine(rec: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The machine part of `rec` (default: this process's) under the names the
  kernel benchmark's and the CPU study's rows keep at their top level, which
  their reports and resumption read: platform, device_kind (JAX's own, "cpu"
  on CPU), device_count, cpu, cpu_cores, jax_version."""
  rec = fields() if rec is None else rec
  return {"platform": rec.get("platform"), "device_kind": jax_device_kind(rec),
          "device_count": rec.get("device_count"), "cpu": rec.get("cpu"),
          "cpu_cores": rec.get("cpu_cores"),
          "jax_version": (rec.get("versions") or {}).get("jax")}


def _flat_commit(value: Any) -> tuple[str | None, bool | None]:
  """(commit, dirty) of a commit kept at a row's top level: `SHA`, or
  `SHA+dirty` as the compile check wrote it (dirty unknown for a bare SHA)."""
  if not isinstance(value, str) or not value:
    return None, None
  if value.endswith(_FLAT_DIRTY_SUFFIX):
    return value[:-len(_FLAT_DIRTY_SUFFIX)] or None, True
  return value, None


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
  """The record of a row written before rows carried `KEY`, from the fields
  some writers kept at the row's top level: the compile check's `commit`
  (`SHA+dirty`), `versions`, `command`, `date` and `host_cpu` (the host that
  compiled; its `device_kind` is the target's, not a record's); the first
  init-logits rows' `commit`, `dirty`, `jax_version`, `flax_version`,
  `platform`, `cpu`, `cpu_cores`, `xla_flags` and `command`; the first kernel
  benchmark rows' `platform`, `device_kind` (JAX's), `cpu` and `cpu_cores`.
  A row with none of them (the first training rows) is all unknown."""
  compiled = "host_cpu" in row or "target" in row
  commit, dirty = _flat_commit(row.get("commit"))
  if isinstance(row.get("dirty"), bool):
    dirty = row["dirty"]
  found = row.get("versions")
  if isinstance(found, Mapping):
    versions_found = dict(found)
  else:
    versions_found = {name: row[key] for name, key in (("jax", "jax_version"),
                                                       ("flax", "flax_version"))
                      if isinstance(row.get(key), str)}
  cpu = row.get("host_cpu") if compiled else row.get("cpu")
  platform = None if compiled else row.get("platform")
  device_kind = None if compiled else row.get("device_kind")
  if platform == "cpu" and device_kind:
    device_kind = device_name(platform, device_kind, cpu)
  return record(commit=commit, dirty=dirty, versions=versions_found, platform=platform,
                device_kind=device_kind, command=row.get("command"),
                xla_flags=None if compiled else row.get("xla_flags"),
                cpu=cpu, cpu_cores=row.get("cpu_cores"), date=row.get("date"))


def of(row: Mapping[str, Any]) -> dict[str, Any]:
  """The provenance a row records, every field of `FIELDS` present (None
  where the row does not say): its `KEY` (a record gathered before a field
  existed lacks it), or for a row written before rows carried one, what its
  top level says (`_flat`); commit "unknown" where nothing does."""
  recorded = row.get(KEY)
  if isinstance(recorded, Mapping):
    return {**record(commit=None, dirty=None, versions={}, platform=None, device_kind=None,
                     command=None), **recorded}
  return _flat(row)
