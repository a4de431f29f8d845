"""Reading a run directory (status, report, plots, export and its formats, the card) or planning one
(prepare, check, plan). The run path never imports these.

May import: the base modules, tokens, http, rundir, progress, inputs, fleet, resume, send, engine, shards.
"""
