"""Reading any sweep's results: reports, tables, plots, significance, scaling.

The general analyses, above `attention_jax.training` (one run) and
`attention_jax.sweep` (many runs): its modules read workdirs through
`sweep.workdir`, `training.run_folder` and `training.metrics_log` and never
build a trainer; nothing in `training` or `sweep` imports from here (a
sweep's driver hands `reports.write` to the sweep, `sweep.runner.Report`).
It does not import `attention_jax.measure` (nor the reverse). A study's own
rule, tables and figures live in its folder, `experiments/<study>/`.

  reports           a workdir's results.jsonl, table.md and plots, and a grid's
  tables            the one Markdown table writer, and the tables of result rows
  plots             their figures
  significance      paired approximate randomisation of test BLEU between two runs
  scaling           log-log slopes with a t interval
  attention_kinds   a Transformer sweep's per-kind logits and saturation over training
"""
