"""Checks, on the GPU machine, that its image and the bundle's wheels work together.

Usage: python scripts/gpu_versions.py SITE PYPROJECT
  SITE       the folder the bundle's wheels were installed into (on PYTHONPATH)
  PYPROJECT  the project's pyproject.toml

Run by scripts/gpu_run.sh before any stage, with the image's Python and the
bundle's wheels on the path. Three checks, in this order:
  1. every requirement the project (pyproject) and the carried wheels declare
     on a distribution the image provides holds for the image's version
     (flax, optax, orbax-checkpoint, jax, protobuf, ...);
  2. the minimums no metadata declares (`UNDECLARED`);
  3. the modules the stages import, import.
Prints one line of versions (for device.txt) and exits 0, or prints one line
`error: ...` naming every failure and exits 2.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import re
import sys
import tomllib

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

# Minimums that no package metadata states, as (needed by, name, minimum, why).
# tensorflow-metadata declares protobuf>=4.25.2, but the generated code of the
# release carried (1.21.0) was made with protoc 6.31 and refuses an older
# runtime: `import tensorflow_datasets` failed against protobuf 5.x when tried
# on CPU with the image's package set.
UNDECLARED = (
    ("tensorflow-metadata", "protobuf", "6.31",
     "its generated code needs protobuf runtime >= 6.31 ('import tensorflow_datasets' "
     "fails against 5.x)"),
)
# What the stages import (the data pipeline pulls in TFDS and its protos).
MODULES = ("jax", "flax.nnx", "optax", "orbax.checkpoint", "tensorflow_datasets",
           "array_record", "sentencepiece", "sacrebleu", "attention_jax.data.input_pipeline")
SHOWN = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "protobuf",
         "tensorflow-datasets", "tensorflow-metadata")


def canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def installed(name: str, path: list[str] | None = None) -> str | None:
  """The version of distribution `name` on `path` (default sys.path), or None."""
  try:
    if path is None:
      return md.version(name)
    dists = list(md.distributions(name=name, path=path))
    return dists[0].version if dists else None
  except md.PackageNotFoundError:
    return None


def carried(site: str) -> dict[str, md.Distribution]:
  """The distributions installed into `site` from the bundle, by canonical name."""
  return {canonical(d.metadata["Name"]): d for d in md.distributions(path=[site])}


def unmet(requirements: list[tuple[str, str]], skip: set[str]) -> list[str]:
  """`(needed by, requirement text)` pairs whose distribution (not in `skip`)
  is installed at a version outside the specifier, or missing; one message each."""
  env = {**default_environment(), "extra": ""}
  problems = []
  for owner, text in requirements:
    req = Requirement(text)
    if canonical(req.name) in skip or (req.marker is not None and not req.marker.evaluate(env)):
      continue
    have = installed(req.name)
    if have is None:
      problems.append(f"{req.name} is missing ({owner} needs {req})")
    elif req.specifier and not req.specifier.contains(have, prereleases=True):
      problems.append(f"the image has {req.name} {have}, {owner} needs {req}")
  return problems


def undeclared(carried_names: set[str]) -> list[str]:
  """Failures of `UNDECLARED` minimums whose dependent is carried."""
  problems = []
  for owner, name, minimum, why in UNDECLARED:
    if owner not in carried_names:
      continue
    have = installed(name)
    try:
      ok = have is not None and Version(have) >= Version(minimum)
    except InvalidVersion:
      ok = False
    if not ok:
      problems.append(f"the image has {name} {have or 'none'}, {owner} (carried) needs "
                      f"{name}>={minimum}: {why}")
  return problems


def import_failures(modules=MODULES) -> list[str]:
  problems = []
  for module in modules:
    try:
      importlib.import_module(module)
    except Exception as e:  # pylint: disable=broad-except
      last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
      problems.append(f"import {module} fails: {type(e).__name__}: {last[:200]}")
  return problems


def main(argv: list[str]) -> int:
  if len(argv) != 3:
    print("error: usage: python scripts/gpu_versions.py SITE PYPROJECT", file=sys.stderr)
    return 2
  site, pyproject = argv[1], argv[2]
  if not os.path.isdir(site):
    print(f"error: SITE {site!r} is not a folder.", file=sys.stderr)
    return 2
  try:
    with open(pyproject, "rb") as f:
      project = tomllib.load(f)["project"]
  except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
    print(f"error: cannot read the project's requirements from {pyproject!r}: {e}",
          file=sys.stderr)
    return 2
  bundle = carried(site)
  requirements = [(project["name"], text) for text in project.get("dependencies", [])]
  for name, dist in bundle.items():
    requirements += [(f"{name} {dist.version} (carried)", text) for text in dist.requires or ()]
  problems = (unmet(requirements, skip=set(bundle)) + undeclared(set(bundle))
              + import_failures())
  if problems:
    print("error: the GPU image and the bundle do not fit: " + "; ".join(problems) +
          ". Rebuild the bundle for this image (scripts/gpu_image_packages.txt) or carry "
          "the versions needed.", file=sys.stderr)
    return 2
  print("versions: " + ", ".join(f"{n} {installed(n) or '-'}" for n in SHOWN))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
