"""Many runs: the flat config and its flags, the presets, the plan of a sweep,
its workdir and the rules by which a run folder there is resumed or extended.

A layer above `attention_jax.training` (one run), below
`attention_jax.analysis` (reading results): a sweep hands each of its points
to the trainer as a `training.run_config.RunConfig`, and asks for its reports
through the function its driver hands in (`runner.Report`).

  config        `ExperimentConfig` (every flag), `GridPoint`, `--sweep` axes, presets
  presets/      one file per preset: its command, time and expected result
  runner        the plan (`Plan`, one `Job` per arm and dim) and running it
  workdir       the workdir layout, the run fingerprint, resume and extend
  workdir_lock  one driver per workdir
  workers       `--workers`: one process per run
  datasets      a config's dataset, loaded once
  host_memory   freed host memory kept by a driver's process (glibc's allocator)
"""
