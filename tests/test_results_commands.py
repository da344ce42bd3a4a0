"""results/transformer_cpu/commands.sh: the Transformer's d_k ablation with its extension
rule, run with stand-in drivers (the real run takes 11 hours on 2 cores): it extends
every run by 500 steps while a scaled_dot run ends below validation BLEU 12, copies
each stage's reports, and a stopped run resumes at the stage it was at.
results/lr_threshold/transformer_lr_cpu/commands.sh copy: finished runs into results/, no
checkpoints, unfinished runs left out."""

import gzip
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "results", "transformer_cpu", "commands.sh")

# `python` for the script: `-c` code runs as Python does; `-m DRIVER` is logged
# and the ablation writes the files of a finished stage, scaled_dot's seeds at
# best validation BLEU `BLEU[steps]` (a `dot` run far below: not the rule's).
STAND_IN = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(args[1])
        sys.exit(0)
    module, flags = args[1], dict(a[2:].split("=", 1) for a in args[2:] if "=" in a)
    with open(os.environ["CALLS"], "a") as f:
        f.write(" ".join(args[1:]) + "\\n")
    BLEU = {{1500: (11.63, 11.28), 2000: (12.62, 13.52)}}
    if module == "experiments.ablation":
        steps, workdir = int(flags["steps"]), flags["workdir"]
        rows = [dict(arm="scaled_dot", dim=16, seed=s, steps=steps, val_bleu=b)
                for s, b in enumerate(BLEU[steps])]
        rows.append(dict(arm="dot", dim=16, seed=0, steps=steps, val_bleu=1.5))
        for arm in ("scaled_dot_d16", "dot_d16"):
            os.makedirs(os.path.join(workdir, "runs", arm), exist_ok=True)
            with open(os.path.join(workdir, "runs", arm, "metrics.jsonl"), "w") as f:
                f.write(json.dumps({{"step": steps}}) + "\\n")
        with open(os.path.join(workdir, "results.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\\n" for r in rows)
        for name in ("table.md", "ablation.png", "validation.png", "diagnostics.png"):
            with open(os.path.join(workdir, name), "w") as f:
                f.write(f"{{name}} at {{steps}}\\n")
        print(f"trained to {{steps}}")
    elif module == "experiments.attention_kinds":
        print(f"kinds up to {{flags['last_step']}}")
    """)


def _run(tmp_path, *args, script=SCRIPT, extra_env=()):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  (bin_dir / "python").write_text(STAND_IN.format(python=sys.executable))
  (bin_dir / "python").chmod(0o755)
  env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
         "CALLS": str(tmp_path / "calls.log"), **dict(extra_env)}
  proc = subprocess.run(["bash", script, *args], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout, (tmp_path / "calls.log").read_text().splitlines()


def test_the_rule_extends_once_and_each_stage_is_copied(tmp_path):
  out, calls = _run(tmp_path, "runs/t")
  assert calls == [
      "experiments.prepare_data --vocab_size=2000",
      "experiments.ablation --preset=transformer --workdir=runs/t --steps=1500",
      "experiments.attention_kinds --preset=transformer --workdir=runs/t --last_step=1500",
      "experiments.ablation --preset=transformer --workdir=runs/t --steps=2000",
      "experiments.attention_kinds --preset=transformer --workdir=runs/t --last_step=2000"]
  assert "rule at 1500 steps fires (2 scaled_dot runs below 12)" in out
  assert "rule at 2000 steps: every scaled_dot run has best validation BLEU >= 12" in out
  here = tmp_path / "results" / "transformer_cpu"
  assert sorted(os.listdir(here)) == ["steps1500", "steps2000"]
  assert sorted(os.listdir(here / "steps1500")) == [
      "ablation.log", "ablation.png", "diagnostics.png", "kinds.md", "results.jsonl",
      "table.md", "validation.png"]
  assert (here / "steps1500" / "table.md").read_text() == "table.md at 1500\n"
  assert (here / "steps1500" / "ablation.log").read_text() == "trained to 1500\n"
  assert (here / "steps1500" / "kinds.md").read_text() == "kinds up to 1500\n"
  # the final stage also keeps every run's metrics log, named by its run folder
  assert sorted(os.listdir(here / "steps2000" / "metrics")) == ["dot_d16.jsonl",
                                                                "scaled_dot_d16.jsonl"]


def test_a_stopped_run_resumes_at_its_stage(tmp_path):
  out, calls = _run(tmp_path, "runs/t", "2000")
  assert [c for c in calls if "ablation" in c] == [
      "experiments.ablation --preset=transformer --workdir=runs/t --steps=2000"]
  assert "fires" not in out


def test_the_grids_copy_brings_finished_runs_without_checkpoints_and_reports(tmp_path):
  work = tmp_path / "w"
  done = work / "main" / "learning_rate=0.001" / "runs" / "dot_d16"
  unfinished = work / "main" / "learning_rate=0.01" / "runs" / "dot_d16"
  control = work / "controls" / "learning_rate=0.0001" / "runs" / "qk_norm_d256"
  for run in (done, unfinished, control):
    (run / "checkpoints" / "250").mkdir(parents=True)
    (run / "checkpoints" / "250" / "state").write_text("weights")
    (run / "metrics.jsonl").write_text(f'{{"step": 250, "run": "{run.name}"}}\n')
  for run in (done, control):
    (run / "result.json").write_text("[]")
    (run / "test_translations.json").write_text("{}")
  script = os.path.join(ROOT, "results", "lr_threshold", "transformer_lr_cpu", "commands.sh")
  out, calls = _run(tmp_path, "copy", script=script,
                    extra_env={"W": str(work), "PY": "python"})
  here = tmp_path / "results" / "lr_threshold" / "transformer_lr_cpu"
  copied = here / "main" / "learning_rate=0.001" / "runs" / "dot_d16"
  assert sorted(os.listdir(copied)) == [
      "metrics.jsonl", "result.json", "test_translations.json.gz"]
  assert sorted(os.listdir(here / "controls" / "learning_rate=0.0001" / "runs" /
                           "qk_norm_d256")) == ["metrics.jsonl", "result.json",
                                                "test_translations.json.gz"]
  # The translations are kept gzip'd, byte for byte what the run wrote.
  assert gzip.decompress((copied / "test_translations.json.gz").read_bytes()) == b"{}"
  assert not (here / "main" / "learning_rate=0.01").exists()  # no result.json: still running
  assert "copied main/learning_rate=0.001/runs/dot_d16" in out
  assert calls == [
      "experiments.lr_threshold.report --main=results/lr_threshold/transformer_lr_cpu/main "
      "--controls=results/lr_threshold/transformer_lr_cpu/controls --out=results/lr_threshold/transformer_lr_cpu"]


def test_the_premise_grids_copy_brings_every_stage_and_writes_both_reports(tmp_path):
  work = tmp_path / "w"
  runs = {
      "coarse": work / "coarse" / "learning_rate=0.0001" / "runs" / "dot_d256",
      "extra": work / "extra" / "dot_d64" / "learning_rate=0.0018" / "runs" / "dot_d64",
      "fine": work / "glorot_fine" / "learning_rate=0.0056" / "runs" / "scaled_dot_d16"}
  for run in runs.values():
    (run / "checkpoints" / "250").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 250}\n')
    (run / "result.json").write_text("[]")
    (run / "test_translations.json").write_text("{}")
    (run / "attention.json").write_text('{"weights": []}')
  script = os.path.join(ROOT, "results", "lr_threshold", "transformer_lr_premise_cpu", "commands.sh")
  out, calls = _run(tmp_path, "copy", script=script, extra_env={"W": str(work), "PY": "python"})
  study = tmp_path / "results" / "lr_threshold"
  here, glorot = study / "transformer_lr_premise_cpu", study / "transformer_lr_cpu"
  for copied in (here / "coarse" / "learning_rate=0.0001" / "runs" / "dot_d256",
                 here / "extra" / "dot_d64" / "learning_rate=0.0018" / "runs" / "dot_d64",
                 glorot / "fine" / "learning_rate=0.0056" / "runs" / "scaled_dot_d16"):
    # attention.json gzip'd as the translations are: no report of these grids reads it
    assert sorted(os.listdir(copied)) == [
        "attention.json.gz", "metrics.jsonl", "result.json", "test_translations.json.gz"], copied
    assert gzip.decompress((copied / "attention.json.gz").read_bytes()) == b'{"weights": []}'
  assert calls == [
      "experiments.lr_threshold.report --preset=transformer_lr_premise_cpu "
      "--main=results/lr_threshold/transformer_lr_premise_cpu --out=results/lr_threshold/transformer_lr_premise_cpu",
      "experiments.lr_threshold.report --main=results/lr_threshold/transformer_lr_cpu/main "
      "--controls=results/lr_threshold/transformer_lr_cpu/controls --fine=results/lr_threshold/transformer_lr_cpu/fine "
      "--out=results/lr_threshold/transformer_lr_cpu/refined",
      # the two grids side by side: the Glorot grid's refined report beside the premise's
      # once complete (side_by_side.glorot_folder), its committed one before
      "experiments.lr_threshold.side_by_side --glorot=results/lr_threshold/transformer_lr_cpu "
      "--glorot_refined=results/lr_threshold/transformer_lr_cpu/refined "
      "--premise=results/lr_threshold/transformer_lr_premise_cpu "
      "--out=results/lr_threshold/transformer_lr_premise_cpu/side_by_side.md"]


def test_the_premise_grids_seed_puts_committed_runs_into_a_fresh_workdir(tmp_path):
  """`seed`: a machine without the grid's workdir gets every committed run
  folder back where `run` looks (so it skips them), and a run folder the
  workdir already has is left as it is."""
  study = tmp_path / "results" / "lr_threshold"
  committed = {
      "coarse/learning_rate=0.0001/runs/dot_d256":
          study / "transformer_lr_premise_cpu" / "coarse" / "learning_rate=0.0001" / "runs" / "dot_d256",
      "coarse/learning_rate=0.001/runs/dot_d16":
          study / "transformer_lr_premise_cpu" / "coarse" / "learning_rate=0.001" / "runs" / "dot_d16",
      "extra/dot_d64/learning_rate=0.1/runs/dot_d64":
          study / "transformer_lr_premise_cpu" / "extra" / "dot_d64" / "learning_rate=0.1" / "runs" / "dot_d64",
      "glorot_fine/learning_rate=0.0056/runs/scaled_dot_d16":
          study / "transformer_lr_cpu" / "fine" / "learning_rate=0.0056" / "runs" / "scaled_dot_d16"}
  for run in committed.values():
    run.mkdir(parents=True)
    (run / "result.json").write_text("[]")
    (run / "config.json").write_text("{}")
  work = tmp_path / "w"
  kept = work / "coarse" / "learning_rate=0.001" / "runs" / "dot_d16"
  kept.mkdir(parents=True)
  (kept / "metrics.jsonl").write_text("under way\n")
  script = os.path.join(ROOT, "results", "lr_threshold", "transformer_lr_premise_cpu", "commands.sh")

  def seed():
    proc = subprocess.run(["bash", script, "seed"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "W": str(work)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()

  said = seed()
  assert sorted(said) == sorted(f"seeded {work}/{rel}" for rel in committed
                                if rel != "coarse/learning_rate=0.001/runs/dot_d16")
  for rel in committed:
    if rel != "coarse/learning_rate=0.001/runs/dot_d16":
      assert sorted(os.listdir(work / rel)) == ["config.json", "result.json"]
  assert sorted(os.listdir(kept)) == ["metrics.jsonl"]  # never over a run it has
  assert seed() == []  # a second seed finds nothing to bring


# `python` for the premise grid's run loop: each `report --plan` prints the
# next of the plans in $PLANS (separated by lines of ---; none once they run
# out); every call is logged.
PLAN_STAND_IN = textwrap.dedent("""\
    #!{python}
    import os, sys
    with open(os.environ["CALLS"], "a") as f:
        f.write(" ".join(sys.argv[2:]) + "\\n")
    if "--plan" in sys.argv:
        with open(os.environ["PLANS"]) as f:
            plans = f.read().split("---\\n")
        with open(os.environ["PLANS"], "w") as f:
            f.write("---\\n".join(plans[1:]))
        print(plans[0] if plans else "", end="")
    """)


def _premise_run(tmp_path, plans):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "python").write_text(PLAN_STAND_IN.format(python=sys.executable))
  (bin_dir / "python").chmod(0o755)
  (tmp_path / "plans").write_text("---\n".join(plans))
  script = os.path.join(ROOT, "results", "lr_threshold", "transformer_lr_premise_cpu", "commands.sh")
  env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PY": "python",
         "W": "w", "CALLS": str(tmp_path / "calls.log"), "PLANS": str(tmp_path / "plans")}
  proc = subprocess.run(["bash", script, "run"], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=120)
  return proc, (tmp_path / "calls.log").read_text().splitlines()


def test_the_premise_loop_trains_each_round_then_the_glorot_refinement(tmp_path):
  proc, calls = _premise_run(tmp_path, ["dot 16 0.0056\nscaled_dot 256 0.018\n", ""])
  assert proc.returncode == 0, proc.stderr
  trained = [c for c in calls if c.startswith("experiments.ablation")]
  assert trained[0].endswith("--workdir=w/coarse --sweep=learning_rate=1e-4,3.2e-4,1e-3,3.2e-3,1e-2,3.2e-2")
  assert sorted(trained[1:3]) == sorted([
      "experiments.ablation --preset=transformer_lr_premise_cpu --workdir=w/extra/dot_d16 "
      "--arms=dot --dims=16 --baseline=dot --workers=1 --sweep=learning_rate=0.0056",
      "experiments.ablation --preset=transformer_lr_premise_cpu --workdir=w/extra/scaled_dot_d256 "
      "--arms=scaled_dot --dims=256 --baseline=scaled_dot --workers=1 --sweep=learning_rate=0.018"])
  assert trained[3] == ("experiments.ablation --preset=transformer_lr_cpu --workdir=w/glorot_fine "
                        "--arms=dot,scaled_dot --sweep=learning_rate=1.8e-3,5.6e-3,1.8e-2")
  assert "the premise grid is complete by its rule" in proc.stdout


def test_a_round_that_leaves_the_same_runs_unfinished_stops_the_loop_naming_them(tmp_path):
  # The plan lists a run the round could not finish twice running: the loop
  # stops there (rather than training it for ever) and never starts the
  # Glorot refinement.
  proc, calls = _premise_run(tmp_path, ["dot 16 0.0056\n", "dot 16 0.0056\n", ""])
  assert proc.returncode == 1
  assert proc.stderr.strip() == "error: the round just trained left these unfinished: dot 16 0.0056"
  assert len([c for c in calls if "--workdir=w/extra/dot_d16" in c]) == 1
  assert not any("glorot_fine" in c for c in calls)
