"""Compiling the project's programs for accelerators on a CPU-only host.

`run` (the command: memory, FLOPs, predicted time, per target), `cases` (the
programs), `mesh` (training steps over several devices, and their
collectives), `launch_check` (kernel launches from a GPU program's thunks),
`tables` (the report). README.md: question, commands, time, results.
"""
