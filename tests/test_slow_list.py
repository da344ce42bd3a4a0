"""tests/slow_tests.txt: every entry names a test that exists, and listing a
test gives it the `slow` marker (tests/conftest.py)."""

import ast
import os
import re

import pytest

from tests import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_listed_test_is_defined_in_its_file():
  listed = conftest._listed_slow_tests()
  assert len(listed) > 10
  for nodeid in listed:
    path, name = nodeid.split("::", 1)
    function = re.sub(r"\[.*$", "", name)
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert function in names, nodeid


class _Item:
  def __init__(self, nodeid):
    self.nodeid, self.markers = nodeid, []

  def add_marker(self, marker):
    self.markers.append(marker.name)


class _Config:
  def __init__(self, args):
    self.args = args


def test_listed_tests_get_the_slow_marker_and_a_stale_entry_is_one_error():
  listed = sorted(conftest._listed_slow_tests())
  path = listed[0].split("::", 1)[0]
  same_file = [n for n in listed if n.startswith(path + "::")]
  items = [_Item(n) for n in same_file] + [_Item(path + "::test_not_listed")]
  conftest.pytest_collection_modifyitems(_Config(["tests"]), items)
  assert [item.markers for item in items] == [["slow"]] * len(same_file) + [[]]
  # A listed test missing from its collected file: renamed without its entry.
  with pytest.raises(pytest.UsageError, match="slow_tests.txt names 1 test"):
    conftest.pytest_collection_modifyitems(_Config(["tests"]), items[1:])
  # A run of chosen node ids collects only those: nothing to check.
  conftest.pytest_collection_modifyitems(_Config([listed[1]]), items[1:])
