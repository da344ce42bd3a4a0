"""Fixtures for the data tests: the real SWORD modules, when installed."""

import pytest

from attention_jax.data import sword


@pytest.fixture(scope="session")
def sword_root():
  """The SWORD root with both modules, or skip (install: `make sword`)."""
  try:
    return sword.find_sword_root()
  except sword.SwordModuleError as e:
    pytest.skip(f"SWORD modules not installed ({e})")
