"""The footnote at initialisation: attention logits at step 0 against d_k.

`run` is the command, `probes` reads the modules' queries, keys and logits,
`tables` fits and writes them. README.md: question, command, time, results.
"""
