"""The measuring instruments every study shares: clocks, counters and the row's provenance.

A floor of its own just above the attention functions: it imports none of
the models, training, sweep or analysis, so a run (`training`, `sweep`) can
record its provenance from here and any study can time, count and compile
with the same tools. It builds no trainer: a study hands it the programs.

  benchmarking     clocks (`time_steps`, `time_interleaved`, `timed`), matmul peaks,
                   the naive float32 references and the check against them, the machine
  flops            FLOPs of a jaxpr, every loop counted
  hlo              HLO text: loops, trip counts, the loop-aware cost of a program
  hlo_profile      where a traced XLA:CPU step's time goes, by part of the model
  thunks           a GPU program's kernel launches, from XLA:GPU's thunk sequence
  compile_targets  accelerators to compile for on a CPU host, and the roofline prediction
  compile_device   compiling one program for a described device: memory, FLOPs, time
  step_time        the batches a training step is timed on (the trainer's own stream)
  provenance       the one schema of a result row's provenance: commit, versions, machine
"""
