"""Reading a run directory: status (one run or a claimed-shard run), report and its plots, and what the run
files say (rundata), for the commands that look at a run from outside. The run path never imports these.

May import: the base modules, tokens, http, rundir, progress, inputs, fleet, resume, send, engine, shards.
"""
