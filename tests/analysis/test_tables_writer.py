"""The one Markdown table writer, `tables.markdown`, and that every table uses it.

Each report used to build its header and separator rows by hand, in two
spacings and with its own alignment marks; a table written twice that way
drifts apart. The scan below reads the source (it imports nothing) and
fails on any string literal that is a piece of a separator row outside the
writer's module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from attention_jax.analysis import tables

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("attention_jax", "experiments", "scripts")
WRITER = Path("attention_jax/analysis/tables.py")
# Modules that may not import `attention_jax.analysis` (the layers below it)
# and so would keep a table of their own: none (the CPU profile's table is the
# cpu_efficiency study's, which imports the writer).
BELOW_THE_WRITER = ()
# A separator cell next to a pipe: `|---|`, `| ---: |`, a trailing `|:---:`,
# or a piece of a row built by repetition, `"---|" * n`.
SEPARATOR = re.compile(r"\|[ \t]*:?-{3,}:?[ \t]*(?:\||$)|^[ \t]*:?-{3,}:?[ \t]*\|", re.M)


def test_markdown_writes_the_header_the_alignment_and_the_rows():
  text = tables.markdown(["name", "n", "share"], [["a", "1", "10%"], ["bb", "22", "5%"]],
                         align=[None, "r", "c"])
  assert text == ("| name | n | share |\n"
                  "|---|---:|:---:|\n"
                  "| a | 1 | 10% |\n"
                  "| bb | 22 | 5% |\n")


def test_markdown_left_alignment_and_the_padded_separator():
  text = tables.markdown(["cell", "ms"], [["dot:8", "1.5"]], align="lr", padded=True)
  assert text == "| cell | ms |\n| :--- | ---: |\n| dot:8 | 1.5 |\n"


def test_markdown_empty_cells_short_rows_and_no_rows():
  # An empty string is a cell like any other; a short row stays short, or
  # with `fill` ends in blank cells.
  assert tables.markdown(["a", "b", "c"], [["x", ""], ["y"]]) == (
      "| a | b | c |\n|---|---|---|\n| x |  |\n| y |\n")
  assert tables.markdown(["a", "b", "c"], [["x", ""], ["y"]], fill=True) == (
      "| a | b | c |\n|---|---|---|\n| x |  | |\n| y | | |\n")
  assert tables.markdown(["a", 2], [[1, None]]) == "| a | 2 |\n|---|---|\n| 1 | None |\n"
  assert tables.markdown(["a"], []) == "| a |\n|---|\n"


def test_markdown_without_a_header_writes_the_rows_alone():
  # A table printed a row at a time, as its rows are measured.
  assert tables.markdown(None, [["a", "1"]]) == "| a | 1 |\n"


@pytest.mark.parametrize("header, rows, align", [
    ([], [], None),
    (["a"], [["x", "y"]], None),
    (["a", "b"], [], "r"),
    (["a"], [], ["x"]),
])
def test_markdown_refuses_a_table_it_cannot_write(header, rows, align):
  with pytest.raises(ValueError):
    tables.markdown(header, rows, align=align)


def _separator_literals(path: Path) -> list[str]:
  """Every string literal (f-string pieces too) of `path` holding a piece of a
  Markdown separator row, as `path:line: text`."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
          for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and SEPARATOR.search(node.value)]


def test_no_module_writes_a_separator_row_by_hand():
  found = []
  for folder in SCANNED:
    for path in sorted((ROOT / folder).rglob("*.py")):
      if path.relative_to(ROOT) not in (WRITER, *BELOW_THE_WRITER):
        found += _separator_literals(path)
  assert not found, "write these tables with attention_jax.analysis.tables.markdown:\n" + (
      "\n".join(found))


def test_the_scan_sees_every_way_a_separator_was_written():
  for text in ("|---|---:|", "| --- | ---: |", "---|", "|:---:|", "x |---"):
    assert SEPARATOR.search(text), text
  for text in ("a - b", "--flag", "# ---- section", "x | y"):
    assert not SEPARATOR.search(text), text
