"""How much of a CPU's float32 peak the training step reaches, and where the time goes.

`run` (a step against the machine's matmul peak), `cpu_micro` (the pieces
of a step timed apart), `decode_memory` (the decoders' memory),
`model_step_time` (parameter counts and one step of the reference models).
README.md: question, commands, time, results.
"""
