"""One run: the training and evaluation steps, the ensemble trainer and its
periodic actions, checkpoints, metrics and the run's own folder.

Nothing here knows of a sweep (`attention_jax.sweep`) or of reports
(`attention_jax.analysis`): a run is given its `run_config.RunConfig` and a
folder, and writes its checkpoints, metrics and result rows there.
"""
