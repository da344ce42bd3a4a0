"""Analyses of finished (or still running) experiments: reading results, never training.

A layer above `attention_jax.training`: its modules read workdirs through
`training.rundir` and `training.metrics_log`, so that a rule fixed before a
grid ran is applied by code that cannot change the runs; nothing in
`training` imports from here.

  threshold         the `transformer_lr_cpu` rule: records of a learning-rate x
                    d_k grid, lr*, the absolute criterion, sensitivity, the law
  threshold_tables  its Markdown tables
  threshold_plots   its figures
"""
