"""Why does dot-product attention need its 1/sqrt(d_k)? The learning-rate threshold study.

Its presets (`presets/`: `transformer_lr_cpu`, the committed Glorot grid;
`transformer_lr_premise_cpu`, the grid under the law's own initialisation;
`transformer_lr`, the full grid for an accelerator) hold the rules and verdict
bands, fixed before each grid's first run. `threshold` applies them to a
grid's runs, `tables` and `plots` write the report, `report` is the command.
README.md: the question, the commands, their time, where the results are.
"""
