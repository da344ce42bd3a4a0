"""The command lines stay thin: every experiments/*.py is a short absl main
(flags, a call into the package, writing), its reusable parts in attention_jax/
where they are tested and imported, not copied from one script into another."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def test_every_script_is_at_most_500_lines():
  sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines())
           for p in (ROOT / "experiments").glob("*.py")}
  assert {"compile_check.py", "init_logits.py", "cpu_efficiency.py"} <= set(sizes)
  assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
