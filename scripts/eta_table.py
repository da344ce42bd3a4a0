"""The ETA table of a time-stamped sweep log (commands.sh writes the logs).

    python scripts/eta_table.py results/progress_eta/smoke.log

Every progress line whose run ETA is a number (after the run's first
validation) against the time the run and the sweep really had left: from the
line's stamp to the run's `test BLEU` line, and to the log's last line (the
sweep's reports written). A ratio is the ETA over the time left; the last
line counts the lines within +-25 %.
"""

import re
import sys

from attention_jax.analysis import tables

LINE = re.compile(r"^(?P<t>\d+\.\d+) \[(?P<run>[^\]]+)\] step (?P<step>\d+)/\d+ .*"
                  r"\| ETA (?P<eta>[^,|]+?)(?:, sweep (?P<sweep>[^|]+?))? \| (?P<clock>\d\d:\d\d) UTC")
END = re.compile(r"^(?P<t>\d+\.\d+) \[(?P<run>[^\]]+)\] test BLEU ")
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
GOAL = 0.25


def seconds(text: str | None) -> float | None:
  """'9 s', '1.2 min', '2.0 h' -> seconds; None for 'not yet timed' or None."""
  if text is None:
    return None
  match = re.fullmatch(r"([\d.]+) (s|min|h)", text.strip())
  return float(match.group(1)) * UNITS[match.group(2)] if match else None


def rows(lines: list[str]) -> list[list[str]]:
  stamps = [float(line.split(" ", 1)[0]) for line in lines if re.match(r"^\d+\.\d+ ", line)]
  first, last = stamps[0], stamps[-1]
  ends = {m["run"]: float(m["t"]) for m in map(END.match, lines) if m}
  out = []
  for m in map(LINE.match, lines):
    eta = seconds(m["eta"]) if m else None
    if eta is None:
      continue
    t = float(m["t"])
    run_left, sweep_left = ends[m["run"]] - t, last - t
    sweep = seconds(m["sweep"])
    out.append([m["run"], m["step"], m["clock"], f"{t - first:.1f}", m["eta"].strip(),
                f"{run_left:.1f} s", f"{eta / run_left:.2f}",
                "–" if sweep is None else m["sweep"].strip(), f"{sweep_left:.0f} s",
                "–" if sweep is None else f"{sweep / sweep_left:.2f}"])
  return out


def within(ratio: str) -> bool:
  return ratio != "–" and abs(float(ratio) - 1) <= GOAL


def main(path: str) -> None:
  table = rows(open(path, encoding="utf-8").read().splitlines())
  print(tables.markdown(["run", "step", "clock (UTC)", "t (s)", "run ETA", "run left (true)",
                         "ratio", "sweep ETA", "sweep left (true)", "ratio"], table), end="")
  print(f"\nrun ETA within ±25%: {sum(within(r[6]) for r in table)} of {len(table)} lines; "
        f"sweep ETA: {sum(within(r[9]) for r in table)} of {len(table)}")


if __name__ == "__main__":
  main(sys.argv[1])
