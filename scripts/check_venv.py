"""Whether the venv this runs in still holds the lock it was built from.

    .venv/bin/python scripts/check_venv.py [--requirements OUT]

scripts/bootstrap.sh records the lock a venv was built from in
`<venv>/attention_jax-lock.txt`. Intact means every distribution pinned there
is installed at its version with every file its RECORD lists on disk
(compiled `__pycache__` files aside: Python remakes them). A package folder
deleted by hand (`site-packages/optax`) leaves its metadata behind, so pip
takes it as installed and a version check passes: only its files tell.

Run it with the venv's own Python: it inspects the environment it runs in.
Exit status 0: intact, or not built from a lock (nothing to compare); 1: one
line per broken distribution on stderr, and with `--requirements OUT` their
lock entries (pins with hashes) written to OUT, for
`pip install --require-hashes --no-deps --force-reinstall -r OUT`. The
Makefile runs it on every call, so that `make` repairs what it finds.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "attention_jax-lock.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def canonical(name: str) -> str:
  """A distribution's name as PEP 503 compares it."""
  return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, path: str = "lock") -> dict[str, tuple[str, list[str]]]:
  """`{canonical name: (version, sha256 hashes)}` of a pip lock file; a line
  that is neither a pin, a hash, a comment nor blank is an error naming it."""
  pins: dict[str, tuple[str, list[str]]] = {}
  current = None
  for number, line in enumerate(text.splitlines(), 1):
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
      continue
    pin = _PIN.match(line)
    if pin:
      current = canonical(pin.group(1))
      if current in pins:
        raise ValueError(f"{path}:{number}: {pin.group(1)} pinned twice")
      pins[current] = (pin.group(2), [])
    elif stripped.startswith("--hash=") and current is not None:
      pins[current][1].extend(_HASH.findall(stripped))
    else:
      raise ValueError(f"{path}:{number}: neither an exact pin nor a hash: {stripped!r}")
  return pins


def lock_of(prefix: str) -> str | None:
  """The lock file the venv at `prefix` was built from, None if none."""
  marker = os.path.join(prefix, MARKER)
  if not os.path.exists(marker):
    return None
  with open(marker, encoding="utf-8") as f:
    path = f.read().split()[0]
  return path if os.path.isabs(path) else os.path.join(ROOT, path)


def _same_version(installed: str, pinned: str) -> bool:
  """Versions compared as `packaging` does, where it is installed (it is a
  locked distribution of this project), else as text."""
  try:
    from packaging.version import Version  # pylint: disable=g-import-not-at-top
  except ImportError:
    return installed == pinned
  return Version(installed) == Version(pinned)


def problem(name: str, version: str, dists: dict) -> str | None:
  """What is wrong with the locked `name`==`version` among the installed
  `dists` (canonical name -> distribution), in a few words; None if nothing."""
  dist = dists.get(name)
  if dist is None:
    return "not installed"
  if not _same_version(dist.version, version):
    return f"{dist.version} installed"
  gone = [str(f) for f in dist.files or ()
          if "__pycache__" not in f.parts and not os.path.exists(dist.locate_file(f))]
  if gone:
    return f"{len(gone)} of its files are gone (e.g. {gone[0]})"
  return None


def problems(pins: dict[str, tuple[str, list[str]]],
             dists: dict | None = None) -> dict[str, str]:
  """`{name: what is wrong}` for every pin of `pins` the environment does not
  hold intact (`problem`); `dists` default to this environment's."""
  if dists is None:
    dists = {canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions()
             if d.metadata["Name"]}  # a dist-info without its METADATA names nothing
  found = {name: problem(name, version, dists) for name, (version, _) in pins.items()}
  return {name: why for name, why in found.items() if why is not None}


def requirements(pins: dict[str, tuple[str, list[str]]], names) -> str:
  """The lock entries of `names`, pins with their hashes, as pip reads them."""
  return "".join(f"{name}=={pins[name][0]} "
                 + " ".join(f"--hash=sha256:{h}" for h in pins[name][1]) + "\n"
                 for name in sorted(names))


def main(argv: list[str]) -> int:
  out = None
  if argv[1:2] == ["--requirements"] and len(argv) == 3:
    out = argv[2]
  elif len(argv) != 1:
    print("usage: VENV/bin/python scripts/check_venv.py [--requirements OUT]", file=sys.stderr)
    return 2
  lock = lock_of(sys.prefix)
  if lock is None:
    return 0
  with open(lock, encoding="utf-8") as f:
    pins = parse_lock(f.read(), lock)
  broken = problems(pins)
  for name, why in sorted(broken.items()):
    print(f"{sys.prefix}: {name}=={pins[name][0]} (locked in {os.path.relpath(lock, ROOT)}): "
          f"{why}", file=sys.stderr)
  if out is not None:
    with open(out, "w", encoding="utf-8") as f:
      f.write(requirements(pins, broken))
  return 1 if broken else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
