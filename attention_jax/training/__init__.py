"""Training, evaluation, checkpointing and the ablation sweep."""
