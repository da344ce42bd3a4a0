"""Prints `name==version` for each runtime dependency the GPU machine lacks.

Usage: python scripts/gpu_requirements.py IMAGE_PACKAGES [PYTHON_VERSION]

Run with the project's virtual environment (where attention_jax is
installed): starting from attention_jax's own requirements (no extras), every
requirement whose distribution is not in IMAGE_PACKAGES (one name per line;
`#` comments) is followed through its installed metadata, recursively. A
dependency of a distribution the image already has is the image's business
and is not followed. Versions are the ones installed here, i.e. the ones the
CPU test suite ran with. Environment markers are evaluated for PYTHON_VERSION
(default 3.12, the GPU machines' Python) on Linux.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement


def canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def read_image_packages(path: str) -> set[str]:
  with open(path, encoding="utf-8") as f:
    return {canonical(line.split("#")[0].strip()) for line in f if line.split("#")[0].strip()}


def missing(root: str, image: set[str], python_version: str = "3.12") -> dict[str, str]:
  """`{canonical name: installed version}` of what the image lacks, `root` excluded."""
  env = default_environment()
  env.update(python_version=python_version, python_full_version=f"{python_version}.0",
             sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
             extra="")
  out: dict[str, str] = {}
  todo = [root]
  seen = set()
  while todo:
    name = todo.pop()
    if canonical(name) in seen:
      continue
    seen.add(canonical(name))
    for spec in md.requires(name) or ():
      req = Requirement(spec)
      if req.marker is not None and not req.marker.evaluate(env):
        continue  # an extra, or another platform / Python
      dep = canonical(req.name)
      if dep in image or dep in out:
        continue
      try:
        out[dep] = md.version(req.name)
      except md.PackageNotFoundError:
        sys.exit(f"error: {req.name!r} (needed by {name}) is not installed in {sys.prefix}; "
                 "run `make .venv/.installed-stamp` first.")
      todo.append(req.name)
  return out


def main(argv):
  if len(argv) not in (2, 3):
    sys.exit(__doc__.splitlines()[2])
  try:
    image = read_image_packages(argv[1])
  except OSError as e:
    sys.exit(f"error: cannot read the image's package list {argv[1]!r}: {e.strerror}")
  for name, version in sorted(missing("attention_jax", image, *argv[2:]).items()):
    print(f"{name}=={version}")


if __name__ == "__main__":
  main(sys.argv)
