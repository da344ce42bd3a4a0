"""The commands in the README and the docs run as written: each `python -m`
names a module that exists, flags it defines and values its enum flags take;
each `make` a target of the Makefile; each `bash` a script that exists; and
the README's API tour runs. A new user copying a line gets what it says, not
`No module named` or `Unknown command line flag`."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                   for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
PYTHONS = ("python", "python3", ".venv/bin/python", ".venv-aot/bin/python", "$(PY)", "$PY")
# Flags absl's app.run adds to every driver.
ABSL_APP_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok",
                  "only_check_args", "pdb", "pdb_post_mortem", "run_with_pdb",
                  "run_with_profiling", "profile_file", "use_cprofile_for_profiling"}


def code_blocks(text: str, language: str | None = None) -> list[str]:
  """The fenced code blocks of a markdown text (of `language`, if given)."""
  blocks = re.findall(r"^```([a-z]*)\n(.*?)^```", text, flags=re.S | re.M)
  return [body for lang, body in blocks if language is None or lang == language]


def commands(text: str) -> list[list[str]]:
  """Every shell command of the text's bash (or unlabelled) code blocks, as
  words, comments dropped, continued lines joined, `a && b` split."""
  out = []
  for body in code_blocks(text):
    if body.lstrip().startswith(("import ", "from ", ">>>")):
      continue  # Python, not shell
    for line in body.replace("\\\n", " ").splitlines():
      try:
        words = shlex.split(line, comments=True)
      except ValueError:
        continue
      while words:
        cut = words.index("&&") if "&&" in words else len(words)
        out.append(words[:cut])
        words = words[cut + 1:]
  # Commands in running text and tables: `python -m ...`, `make ...`, `bash ...`.
  for span in re.findall(r"`((?:python3?|\.venv/bin/python|\.venv-aot/bin/python) -m [^`]+"
                         r"|make [a-z][^`]*|bash [^`]+\.sh[^`]*)`", text):
    try:
      out.append(shlex.split(span, comments=True))
    except ValueError:
      continue
  return [w for w in out if w]


def _documented():
  found = []
  for doc in DOCUMENTS:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
      found += [(doc, words) for words in commands(f.read())]
  return found


DOCUMENTED = _documented()


# Prints each module's `--helpfull` in turn: the modules every driver imports
# (JAX, Flax, the library) are imported once, then each module runs as
# `__main__` with `--helpfull` in a child forked from there (before any JAX
# backend starts), as `python -m MODULE --helpfull` runs it but without paying
# the interpreter's and JAX's start-up (most of its 2 s) once per module.
_HELP_SCRIPT = r"""
import json, os, runpy, sys, tempfile
import absl.app, absl.flags, jax, flax.nnx, numpy, attention_jax
out = {}
for module in sys.argv[1:]:
  path = os.path.join(tempfile.gettempdir(), f"helpfull_{os.getpid()}_{module}")
  pid = os.fork()
  if pid == 0:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [module, "--helpfull"]
    code = 0
    try:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
    except BaseException:
      import traceback
      traceback.print_exc()
      code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  os.waitpid(pid, 0)
  with open(path) as f:
    out[module] = f.read()
  os.remove(path)
print(json.dumps(out))
"""


def _helpfull(modules: list[str]) -> dict[str, str]:
  """Each module's `--helpfull` output (`_HELP_SCRIPT`), from one process."""
  proc = subprocess.run([sys.executable, "-c", _HELP_SCRIPT, *modules], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _module_flags(module: str, helpfull: dict[str, str]) -> dict[str, list | None]:
  """The flags a driver accepts, from its own `--helpfull` (some define
  theirs in `main`): name -> enum values or None."""
  text = helpfull[module]
  assert "--helpfull" in text or "--" in text, f"{module} --helpfull printed no flags: {text[-2000:]}"
  found = {}
  for name, enum in re.findall(r"^\s+--(?:\[no\])?(\w+):\s*(<[^>]*>)?", text, re.M):
    found[name] = enum[1:-1].split("|") if enum else None
  return found


def _python_module_commands():
  found = {}
  for doc, words in DOCUMENTED:
    if len(words) >= 3 and words[0] in PYTHONS and words[1] == "-m" and not words[2].isupper():
      found.setdefault(words[2], []).append((doc, words[3:]))
  return found


PYTHON_COMMANDS = _python_module_commands()


def test_the_documents_hold_the_commands_a_new_user_needs():
  """The parser finds them (an empty list would make the tests below vacuous)."""
  assert "experiments.ablation" in PYTHON_COMMANDS
  assert any(words[:2] == ["make", "data"] for _, words in DOCUMENTED)
  assert any(words[:2] == ["source", ".venv/bin/activate"] for doc, words in DOCUMENTED
             if doc == "README.md")


def test_the_readme_activates_the_venv_before_its_first_python_command():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    found = [words for words in commands(f.read())]
  first_python = next(i for i, w in enumerate(found) if w[0] in PYTHONS)
  activate = next(i for i, w in enumerate(found) if w[:2] == ["source", ".venv/bin/activate"])
  assert activate < first_python


@pytest.fixture(scope="module")
def helpfull():
  return _helpfull([m for m in sorted(PYTHON_COMMANDS) if m != "pytest" and os.path.exists(
      os.path.join(ROOT, *m.split(".")) + ".py")])


@pytest.mark.parametrize("module", sorted(PYTHON_COMMANDS))
def test_each_documented_python_command_names_a_module_and_flags_that_exist(module, helpfull):
  assert module.startswith(("experiments.", "pytest")), module
  if module == "pytest":
    return
  assert os.path.exists(os.path.join(ROOT, *module.split(".")) + ".py"), module
  defined = _module_flags(module, helpfull)
  for doc, args in PYTHON_COMMANDS[module]:
    for arg in args:
      if arg == "--":  # what follows is the command's arguments, not its flags (absl)
        break
      if not arg.startswith("--"):
        continue
      name, _, value = arg[2:].partition("=")
      bare = name[2:] if name.startswith("no") and name[2:] in defined else name
      assert bare in defined or bare in ABSL_APP_FLAGS, f"{doc}: `{module} --{name}` is no flag of {module}"
      enum = defined.get(bare)
      if enum and value and "$" not in value and "<" not in value:
        assert value in enum, f"{doc}: `--{name}={value}` is not one of {enum}"


def test_each_documented_make_target_and_script_exists():
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    targets = set(re.findall(r"^([A-Za-z][\w.-]*):", f.read(), flags=re.M))
  for doc, words in DOCUMENTED:
    if words[0] == "make":
      for target in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
        assert target in targets, f"{doc}: `make {target}` is no target of the Makefile"
    if words[0] == "bash" and len(words) > 1 and words[1].endswith(".sh"):
      assert os.path.exists(os.path.join(ROOT, words[1])), f"{doc}: {words[1]} is missing"


def test_the_readme_api_tour_runs():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    tour = [b for b in code_blocks(f.read(), "python") if "attention_jax" in b]
  assert len(tour) == 1
  namespace: dict = {}
  exec(compile(tour[0], "README.md (API tour)", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["logits"].shape == (2, 5, 100)
  assert namespace["ensemble_logits"].shape == (3, 2, 5, 100)
  # Member 0 of the ensemble is the model built alone from seed 0.
  import numpy as np  # pylint: disable=g-import-not-at-top
  tokens, tgt_in = namespace["tokens"], namespace["tgt_in"]
  np.testing.assert_allclose(namespace["member0"](tokens, tgt_in)[0],
                             namespace["model"](tokens, tgt_in)[0], atol=1e-6)


@pytest.mark.slow  # a fresh clone builds its own .venv (2-3 min, the PyPI registry) and runs
def test_the_readme_set_up_and_first_run_work_in_a_fresh_clone(tmp_path):
  """The README's set-up block, as written, in a fresh clone with a fresh home."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    block = next(b for b in code_blocks(f.read(), "bash") if "source .venv/bin/activate" in b)
  clone = tmp_path / "clone"
  subprocess.run(["git", "clone", "-q", ROOT, str(clone)], check=True)
  home = tmp_path / "home"
  home.mkdir()
  # The corpus and SWORD modules of this machine's cache, so that only the
  # clone's own set-up is tested, not the Debian mirror.
  cache = os.path.expanduser("~/.cache/attention_jax")
  if os.path.isdir(cache):
    os.makedirs(home / ".cache", exist_ok=True)
    os.symlink(cache, home / ".cache" / "attention_jax")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST"))}
  env.update(HOME=str(home), PATH=os.environ["PATH"])
  proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env,
                        capture_output=True, text=True, timeout=3000)
  assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
  assert proc.stdout.strip().splitlines()[-1].startswith("wrote ")
  assert os.path.exists(clone / "runs" / "tsmoke" / "table.md")
