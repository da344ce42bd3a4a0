"""Analyses of finished (or still running) experiments: reading results, never training.

The top layer of the package, above `attention_jax.training` (one run) and
`attention_jax.sweep` (many runs): its modules read workdirs through
`sweep.workdir`, `training.run_folder` and `training.metrics_log`, so that a
rule fixed before a grid ran is applied by code that cannot change the runs;
nothing in `training` or `sweep` imports from here (a sweep's driver hands
`reports.write` to the sweep, `sweep.runner.Report`).

  reports           a workdir's results.jsonl, table.md and plots, and a grid's
  tables            Markdown tables of result rows (Britz-style, significance, per kind)
  plots             their figures
  significance      paired approximate randomisation of test BLEU between two runs
  scaling           log-log slopes with a t interval
  threshold         the `transformer_lr_cpu` rule: records of a learning-rate x
                    d_k grid, lr*, the absolute criterion, sensitivity, the law
  threshold_tables  its Markdown tables
  threshold_plots   its figures
"""
