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
  attention_kinds   a Transformer sweep's per-kind logits and saturation over training
  compile_targets   accelerators to compile for on a CPU host, and the roofline prediction
  compile_cases     the compile check's programs (training steps, kernels, additive)
  compile_device    compiling one for a described device: memory, FLOPs, predicted time
  compile_mesh      training steps compiled for several devices, and their collectives
  compile_tables    the compile check's Markdown report
  hlo               HLO text: loops, trip counts, the loop-aware cost of a program
  thunks            a GPU program's kernel launches, from XLA:GPU's thunk sequence
  hlo_profile       where a traced XLA:CPU step's time goes, by part of the model
  init_logits_probes  the attention modules' queries, keys and logits at step 0
  init_logits_tables  their log-log fits, table and figure against d_k
  step_time         the batches a training step is timed on (the clock:
                    `benchmarking.time_steps`)
"""
