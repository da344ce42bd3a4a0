"""Freed host memory kept by the process (attention_jax/sweep/host_memory.py)."""

import os
import subprocess
import sys

import pytest

from attention_jax.sweep import host_memory

# A child process frees and re-allocates a 64 MiB buffer (as XLA:CPU does with
# the one buffer that holds a program's temporaries at every execution) 20
# times, touching every page, and prints its minor page faults per round:
# 16,384 (every 4 KiB page again) with glibc's defaults, which serve anything
# above 32 MiB by mmap and give it back when freed.
_ROUNDS = r"""
import resource, sys
from attention_jax.sweep import host_memory
if sys.argv[1] == "keep":
  assert host_memory.keep_freed_memory()
elif sys.argv[1] == "accelerator":  # asked for, and refused: JAX_PLATFORMS names a GPU
  assert not host_memory.keep_freed_memory()
size = 64 << 20
before = None
for i in range(21):
  buf = bytearray(size)  # calloc'd, then touched page by page below
  buf[::4096] = b"\x01" * (size // 4096)
  del buf
  if i == 0:  # the first round faults in any case
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_round(mode: str, platforms: str = "cpu") -> float:
  env = dict(os.environ, JAX_PLATFORMS=platforms)
  out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True,
                       check=True, env=env)
  return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_buffer_is_reused_without_faulting_its_pages_in_again():
  default, kept = _faults_per_round("default"), _faults_per_round("keep")
  assert default > 8000  # 64 MiB is 16,384 pages: each round maps and faults them afresh
  assert kept < 200


def test_thresholds_must_be_positive():
  with pytest.raises(ValueError, match="mmap_threshold"):
    host_memory.keep_freed_memory(mmap_threshold=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_next_to_an_accelerator_the_allocator_keeps_its_defaults():
  # One arena would make XLA's many compiling threads queue for one lock.
  assert _faults_per_round("accelerator", platforms="cuda") > 8000


@pytest.mark.parametrize("platforms, plugins, expected", [
    ("cpu", ["jax_plugins.xla_cuda13"], True),  # JAX_PLATFORMS wins over what is installed
    ("cuda", [], False),
    ("cpu,cuda", [], False),
    (" tpu ", [], False),
    ("", [], True),  # unset: what is installed decides
    ("", ["jax_plugins.xla_cuda13"], False),
    ("", ["libtpu"], False),
])
def test_cpu_only(monkeypatch, platforms, plugins, expected):
  monkeypatch.setattr(host_memory, "accelerator_plugins", lambda: plugins)
  assert host_memory.cpu_only({"JAX_PLATFORMS": platforms}) is expected
  if not expected:  # refused before glibc is touched (where it is, a child process above:
    # this test process keeps the allocator's defaults)
    assert host_memory.keep_freed_memory(environ={"JAX_PLATFORMS": platforms}) is False


def test_accelerator_plugins_finds_a_plugin_module_without_importing_it(tmp_path, monkeypatch):
  plugin = tmp_path / "jax_plugins" / "xla_stand_in"
  plugin.mkdir(parents=True)
  (plugin / "__init__.py").write_text("raise RuntimeError('imported')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "jax_plugins", raising=False)
  assert "jax_plugins.xla_stand_in" in host_memory.accelerator_plugins()
  assert "jax_plugins.xla_stand_in" not in sys.modules
