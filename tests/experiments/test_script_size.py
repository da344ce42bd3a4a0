"""The command lines stay thin: every driver under experiments/ (a module that
calls `app.run`) is a short absl main (flags, a call into the package or into
its study's modules, writing); the reusable parts live in attention_jax/ or
beside the driver in its study's folder, where they are tested and imported,
not copied from one script into another."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def test_every_driver_is_at_most_500_lines():
  sizes = {}
  for path in (ROOT / "experiments").rglob("*.py"):
    text = path.read_text(encoding="utf-8")
    if "__pycache__" not in path.parts and "app.run(" in text:
      sizes[path.relative_to(ROOT / "experiments").as_posix()] = len(text.splitlines())
  assert {"compile_check/run.py", "init_logits/run.py", "cpu_efficiency/run.py",
          "lr_threshold/report.py", "ablation.py"} <= set(sizes)
  assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
