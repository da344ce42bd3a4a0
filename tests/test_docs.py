"""The documentation keeps its promises: links resolve, the README stays one
screen of reference, every results folder is indexed, every committed
ablation table says what its `results.jsonl` says, and results/ holds data
only: no code, and no path of the machine that made it.

Fast (reads text files only); part of the default suite.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
README_MAX_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def markdown_files() -> list[Path]:
  """The documents whose links are checked."""
  files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
  if RESULTS.is_dir():
    files += sorted(RESULTS.glob("*.md"))
    files += sorted(p for p in RESULTS.glob("*/**/README.md"))
  return [f for f in files if f.is_file()]


def relative_links(text: str) -> list[str]:
  """Targets of the Markdown links and images in `text` that point into the
  repository: code blocks and code spans are not links, and external
  addresses and in-page anchors are left out. Fragments are dropped."""
  text = _CODE_SPAN.sub("", _FENCE.sub("", text))
  targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
  out = []
  for target in targets:
    if _EXTERNAL.match(target) or target.startswith("#"):
      continue
    path = unquote(target.split("#", 1)[0].split("?", 1)[0])
    if path:
      out.append(path)
  return out


def broken_links(doc: Path) -> list[str]:
  """The relative links of `doc` that name no file or folder inside the
  repository."""
  bad = []
  for target in relative_links(doc.read_text(encoding="utf-8")):
    resolved = (doc.parent / target).resolve()
    inside = resolved == ROOT or ROOT in resolved.parents
    if not inside or not resolved.exists():
      bad.append(target)
  return bad


# -- table.md against results.jsonl -------------------------------------------

_CAPTION = re.compile(r"^(?:## )?Test BLEU \(")  # not "Test BLEU difference"
_SLICE = re.compile(r"^a = ([^,:]+)((?:, [^=,:]+ = [^,:]+)*):$")
_MEAN = re.compile(r"^(-?\d+(?:\.\d+)?) ±")


def _value(text) -> object:
  """A swept value as a comparable key: numbers by value, anything else as text."""
  try:
    return float(text)
  except (TypeError, ValueError):
    return str(text)


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def table_bleu_means(table_text: str) -> dict[tuple, float | None]:
  """The mean test BLEU of every cell of the test-BLEU table(s) of an
  ablation's `table.md`, as printed (None for a cell with no mean, e.g. an
  arm not run at that dimension or every seed diverged).

  Keys: `(arm, ((field, value), ...))` with the fields sorted: `dim` for a
  plain ablation's table; for a `--sweep` grid's table also the swept axis
  (its rows) and any further axis (its slice captions, `a = 128, f = v:`).
  """
  means: dict[tuple, float | None] = {}
  in_section, fixed, header = False, {}, None
  for line in table_text.splitlines():
    stripped = line.strip()
    if _CAPTION.match(stripped):
      in_section, fixed, header = True, {}, None
      continue
    if not in_section or not stripped:
      continue
    sliced = _SLICE.match(stripped)
    if sliced:
      fixed = {"dim": _value(sliced.group(1).strip())}
      for pair in filter(None, sliced.group(2).split(", ")):
        field, value = pair.split(" = ")
        fixed[field.strip()] = _value(value.strip())
      header = None
      continue
    if not stripped.startswith("|"):
      in_section = False  # the next caption: the section is over
      continue
    cells = _cells(stripped)
    if header is None:
      header = cells
      continue
    if set("".join(cells)) <= set("-:"):
      continue  # the separator row
    row_field = header[0]
    arms = [a for a in header[1:] if a != "params"]
    where = {**fixed, row_field: _value(cells[0])}
    key_fields = tuple(sorted(where.items()))
    for arm, cell in zip(arms, cells[1:]):
      found = _MEAN.match(cell)
      means[(arm, key_fields)] = float(found.group(1)) if found else None
  return means


def jsonl_bleu_means(rows: list[dict], fields: tuple[str, ...]) -> dict[tuple, float]:
  """Mean test BLEU over the seeds of every (arm, values of `fields`) in the
  rows of a `results.jsonl`, leaving out diverged seeds as the tables do."""
  groups: dict[tuple, list[float]] = {}
  for r in rows:
    if r.get("diverged_at_step") or r.get("test_bleu") is None:
      continue
    key = (r["arm"], tuple(sorted((f, _value(r[f])) for f in fields)))
    groups.setdefault(key, []).append(float(r["test_bleu"]))
  return {k: statistics.fmean(v) for k, v in groups.items()}


def bleu_mismatches(table_text: str, rows: list[dict]) -> list[str]:
  """Where the test-BLEU means printed in `table_text` (2 decimals) differ
  from the means over seeds of `rows`; empty when they agree everywhere."""
  printed = table_bleu_means(table_text)
  if not printed:
    return ["no test-BLEU table found"]
  fields = {f for _, where in printed for f, _ in where}
  computed = jsonl_bleu_means(rows, tuple(sorted(fields)))
  problems = []
  for key in sorted(set(printed) | set(computed), key=repr):
    shown, mean = printed.get(key, "missing"), computed.get(key)
    if shown == "missing":
      problems.append(f"{key}: in results.jsonl ({mean:.2f}) but not in table.md")
    elif mean is None or shown is None:
      if mean is not None or shown is not None:
        problems.append(f"{key}: table.md {shown}, results.jsonl {mean}")
    elif not math.isclose(shown, mean, abs_tol=0.005 + 1e-9):
      problems.append(f"{key}: table.md {shown:.2f}, results.jsonl {mean:.4f}")
  return problems


def _rows(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ablation_folders() -> list[Path]:
  """Every folder under results/ holding an ablation's results.jsonl (rows
  with a test BLEU) and its table.md; other experiments' tables (e.g. the
  statistics at initialisation) are left out."""
  if not RESULTS.is_dir():
    return []
  return sorted(p.parent for p in RESULTS.glob("**/table.md")
                if (p.parent / "results.jsonl").is_file()
                and any("test_bleu" in r for r in _rows(p.parent / "results.jsonl")))


# -- the tests -----------------------------------------------------------------

@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
  assert broken_links(doc) == []


def test_the_readme_is_one_screen_of_reference():
  lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
  assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_results_folder_is_in_the_index():
  index = RESULTS / "README.md"
  linked = {(index.parent / t).resolve() for t in relative_links(index.read_text("utf-8"))}
  linked |= {p.parent for p in linked if p.name == "README.md"}
  folders = [p for p in RESULTS.iterdir() if p.is_dir() and p.name != "archive"]
  folders += [p for p in (RESULTS / "archive").iterdir() if p.is_dir()]
  missing = [str(p.relative_to(RESULTS)) for p in folders
             if not p.name.startswith((".", "__")) and p.resolve() not in linked]
  assert missing == []


def test_every_results_folder_has_a_readme():
  folders = [p for p in RESULTS.iterdir() if p.is_dir() and p.name != "archive"]
  folders += [p for p in (RESULTS / "archive").iterdir() if p.is_dir()]
  assert [str(p.relative_to(RESULTS)) for p in folders
          if not p.name.startswith((".", "__")) and not (p / "README.md").is_file()] == []


# What results/ may hold: data, documents and the shell commands that made them.
RESULTS_EXTENSIONS = {".json", ".jsonl", ".png", ".svg", ".md", ".log", ".txt", ".tsv",
                      ".csv", ".gz", ".sh"}
_PYTHON_LINE = re.compile(rb"^(?:import \w|from [\w.]+ import |#!.*python).*$", re.M)
# A folder of the machine that made a file: a path that means nothing in a clone.
# An absolute path (its first `/` not inside a word or after a placeholder such
# as `<venv>`) into a workspace, a temporary or home folder, or the system's
# install folders (a traceback through the libraries of the device machine:
# /opt/..., /usr/local/..., /usr/lib/python3/dist-packages/...), through to its end.
_PATH_END = rb"[^\s\"'`<>()\[\]{},;]*"
_MACHINE_PATH = re.compile(
    rb"(?<![\w.~>-])/(?:(?:work|tmp|root|home|opt)/|usr/local/|usr/lib)" + _PATH_END
    + rb"|(?<![\w.~>-])/" + _PATH_END + rb"/(?:site|dist)-packages/" + _PATH_END)


def results_files() -> list[Path]:
  """Every file under results/ that git tracks or would add (not ignored);
  outside a git checkout, every file there."""
  try:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard", "results"],
                         capture_output=True, check=True, timeout=60).stdout
  except (OSError, subprocess.SubprocessError):
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())
  return sorted({ROOT / name for name in out.decode().split("\0") if name
                 and (ROOT / name).is_file()})


def code_in_results(files: list[Path], root: Path = ROOT) -> list[str]:
  """The files that are code: by extension (anything but data, documents and
  shell commands), or by content (a line of a Python import or shebang)."""
  bad = [f"{p.relative_to(root)}: a {p.suffix or 'extensionless'} file" for p in files
         if p.suffix not in RESULTS_EXTENSIONS]
  for p in files:
    if p.suffix in RESULTS_EXTENSIONS and p.suffix not in (".png", ".gz"):
      found = _PYTHON_LINE.search(p.read_bytes())
      if found:
        bad.append(f"{p.relative_to(root)}: {found.group(0).decode(errors='replace')!r}")
  return bad


def machine_paths_in(files: list[Path], root: Path = ROOT) -> list[str]:
  """`file:line` of every absolute path of a machine's folders in `files`."""
  bad = []
  for p in files:
    data = p.read_bytes()
    for found in _MACHINE_PATH.finditer(data):
      line = data.count(b"\n", 0, found.start()) + 1
      bad.append(f"{p.relative_to(root)}:{line}")
  return bad


def test_results_hold_no_code():
  # Code there rots untested (a script that no longer ran with today's trainer):
  # it belongs in experiments/ or the package, where the tests run it.
  assert code_in_results(results_files()) == []


def test_no_results_file_names_a_folder_of_the_machine_that_made_it():
  assert machine_paths_in(results_files()) == []


def test_the_results_checks_see_code_and_machine_paths(tmp_path):
  (tmp_path / "kinds.py").write_text("import json\n")
  (tmp_path / "notes.txt").write_text("text\nfrom attention_jax import models\n")
  (tmp_path / "run.log").write_text("ok\nwrote /work/runs/x/table.md, /tmp/y\n")
  (tmp_path / "trace.log").write_text(
      '/opt/torch/.venv/lib/python3.12/site-packages/jax/_src/core.py:12: in bind\n'
      '  File "/usr/local/lib/python3.11/dist-packages/absl/app.py", line 3\n'
      "from /venv/lib/python3.12/site-packages/flax and /usr/lib/python3/x.py\n"
      "cached at /home/alice/.cache/jax and /root/.cache\n"
      "<venv>/lib/python3.12/site-packages/jax/_src/core.py:12 <home>/.cache "
      "site-packages/jax/x.py runs/tmp/x /usr/bin/env\n")
  (tmp_path / "fine.md").write_text("`python -m experiments.ablation --workdir=runs/x`\n"
                                    "    import attention_jax  # indented: an example\n")
  files = sorted(tmp_path.iterdir())
  assert code_in_results(files, tmp_path) == [
      "kinds.py: a .py file", "notes.txt: 'from attention_jax import models'"]
  assert machine_paths_in(files, tmp_path) == [
      "run.log:2", "run.log:2", "trace.log:1", "trace.log:2", "trace.log:3", "trace.log:3",
      "trace.log:4", "trace.log:4"]


@pytest.mark.parametrize("folder", ablation_folders(), ids=lambda p: str(p.relative_to(ROOT)))
def test_table_bleu_means_match_results_jsonl(folder):
  text = (folder / "table.md").read_text(encoding="utf-8")
  assert bleu_mismatches(text, _rows(folder / "results.jsonl")) == []


def test_ablation_folders_are_found():
  names = {str(p.relative_to(RESULTS)) for p in ablation_folders()}
  assert {"quick_cpu", "lr_cpu", "lr_cpu/learning_rate=0.001"} <= names


# -- the checks themselves -------------------------------------------------------

_PLAIN = """Test BLEU (sacrebleu, beam 4), mean ± std (max) over seeds; model=rnn.

| dim | additive | multiplicative | params |
|---|---|---|---|
| 128 | 14.58 ± 0.61 (15.01) | 13.69 ± 1.73 (14.92) | 1.263M |
| 1024 | 15.05 ± 0.50 (15.41) | – | 1.609M |

Validation perplexity (teacher-forced), mean ± std (min) over seeds.

| dim | additive | multiplicative | params |
|---|---|---|---|
| 128 | 99.00 ± 0.00 (99.00) | 99.00 ± 0.00 (99.00) | 1.263M |
"""

_GRID = """Grid over `learning_rate`, `warmup_steps`; tables by `learning_rate` = 0.001, 0.003.

## Test BLEU (sacrebleu, beam 4), mean ± std (max) over seeds

a = 128, warmup_steps = 100:

| learning_rate | additive |
|---|---|
| 0.001 | 8.51 ± 0.31 (8.73) |
| 0.003 | 17.49 ± 0.13 (17.59), diverged (1 of 3 seeds) |

## Validation perplexity, mean ± std (min) over seeds

a = 128, warmup_steps = 100:

| learning_rate | additive |
|---|---|
| 0.001 | 1.00 ± 0.00 (1.00) |
"""


def _row(arm, dim, bleu, **extra):
  return {"arm": arm, "dim": dim, "test_bleu": bleu, "diverged_at_step": None, **extra}


def test_bleu_check_accepts_a_matching_table_and_names_each_difference():
  rows = [_row("additive", 128, 14.0), _row("additive", 128, 15.16),
          _row("multiplicative", 128, 13.69), _row("additive", 1024, 15.05)]
  assert bleu_mismatches(_PLAIN, rows) == []
  rows[0]["test_bleu"] = 13.0  # mean 14.08, printed 14.58
  (problem,) = bleu_mismatches(_PLAIN, rows)
  assert "additive" in problem and "128" in problem and "14.58" in problem
  # a cell printed as "–" must have no rows; a row with no cell is reported too
  extra = [*rows[1:], _row("additive", 128, 14.0), _row("multiplicative", 1024, 5.0),
           _row("scaled_dot", 128, 9.0)]
  assert len(bleu_mismatches(_PLAIN, extra)) == 2


def test_bleu_check_reads_grid_tables_and_leaves_out_diverged_seeds():
  rows = [_row("additive", 128, 8.51, learning_rate=0.001, warmup_steps=100),
          _row("additive", 128, 17.49, learning_rate=0.003, warmup_steps=100),
          {**_row("additive", 128, None, learning_rate=0.003, warmup_steps=100),
           "diverged_at_step": 300}]
  assert table_bleu_means(_GRID) == {
      ("additive", (("dim", 128.0), ("learning_rate", 0.001), ("warmup_steps", 100.0))): 8.51,
      ("additive", (("dim", 128.0), ("learning_rate", 0.003), ("warmup_steps", 100.0))): 17.49}
  assert bleu_mismatches(_GRID, rows) == []
  rows[1]["warmup_steps"] = 500  # now a point the table does not show
  assert len(bleu_mismatches(_GRID, rows)) == 2
  assert bleu_mismatches("no table here", rows) == ["no test-BLEU table found"]


def test_links_in_code_and_external_addresses_are_not_checked():
  text = ("[a](docs/x.md) ![p](results/a%20b.png#top) [e](https://example.org) [s](#usage)\n"
          "`[c](not/a/link.md)`\n```\n[d](neither.md)\n```\n[r]: results/README.md\n")
  assert relative_links(text) == ["docs/x.md", "results/a b.png", "results/README.md"]


# --- docs agree with the code and the committed results ---------------------


def _gpu_preset():
  from attention_jax.sweep.presets import gpu  # pylint: disable=g-import-not-at-top
  return gpu


def test_the_gpu_pieces_the_docs_state_are_the_presets_max_minutes():
  """docs/method.md said '< 9 min' where the preset stops at 7."""
  minutes = _gpu_preset().OVERRIDES["max_minutes"]
  stated = []
  for name in ("docs/method.md", "docs/gpu_tpu.md"):
    text = (ROOT / name).read_text(encoding="utf-8")
    stated += [(name, float(m)) for m in re.findall(
        r"pieces? of (?:< ?|≤ ?|<= ?|at most )?(\d+(?:\.\d+)?)[ -]min", text)]
    stated += [(name, float(m)) for m in re.findall(r"(\d+(?:\.\d+)?)-minute pieces", text)]
  assert {name for name, _ in stated} == {"docs/method.md", "docs/gpu_tpu.md"}, stated
  assert [s for s in stated if s[1] != minutes] == [], f"the preset's max_minutes is {minutes}"


def test_the_docs_name_the_tpu_path_the_workers_code_has():
  """docs/gpu_tpu.md said the code had no TPU-specific path; `--workers`
  gives each worker a chip on a TPU VM (`workers.tpu_groups`)."""
  workers = (ROOT / "attention_jax/sweep/workers.py").read_text(encoding="utf-8")
  assert "def tpu_groups(" in workers and "def tpu_chips(" in workers
  for name in ("docs/gpu_tpu.md", "docs/method.md"):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert "`workers.tpu_groups`" in text, name
    assert "no TPU-specific path" not in text, name


def test_the_readmes_gpu_prediction_is_the_committed_compile_checks():
  """The README's `gpu` row quoted 1.4–107 min from before the GPU unroll;
  it quotes the committed launch table's total for all 12 cells."""
  table = (RESULTS / "compile_check/launches/unrolled/h100.md").read_text(encoding="utf-8")
  (committed,) = re.findall(r"the 12 cells' training steps predicted at ([\d.]+) min", table)
  row = next(line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if line.startswith("| `gpu` |"))
  assert re.findall(r"compile check predicts ([\d.–-]+) min", row) == [committed], row
  assert "compile_check/launches/unrolled" in row


def test_the_britz_wmt_preset_states_its_estimates_and_their_basis():
  from attention_jax.sweep.presets import britz_wmt  # pylint: disable=g-import-not-at-top
  doc = britz_wmt.__doc__
  assert "Estimates, none measured" in doc
  for needle in ("4.5M training pairs", "Download 1.74 GB", "url_checksums",
                 "host memory", "Device memory", "parameters per model", "Time: 340,000 steps"):
    assert needle in doc, needle
  assert britz_wmt.OVERRIDES["steps"] == 340000 and britz_wmt.OVERRIDES["vocab_size"] == 32000
  # The download is what TFDS's own checksums list for the archives of the
  # preset's corpora (`wmt.britz_config`'s subsets).
  import tensorflow_datasets  # pylint: disable=g-import-not-at-top
  sums = Path(tensorflow_datasets.__file__).parent / "url_checksums"
  sizes = {}
  for f in sums.glob("wmt*_translate.txt"):
    for line in f.read_text(encoding="utf-8").splitlines():
      parts = line.split("\t")
      if len(parts) >= 2 and parts[1].isdigit():
        sizes[parts[0]] = int(parts[1])
  archives = ("http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
              "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
              "http://www.statmt.org/wmt15/training-parallel-nc-v10.tgz",
              "http://data.statmt.org/wmt19/translation-task/dev.tgz")
  total = sum(sizes[a] for a in archives) / 1e9
  (stated,) = re.findall(r"Download ([\d.]+) GB", doc)
  assert float(stated) == pytest.approx(total, abs=0.005), total
