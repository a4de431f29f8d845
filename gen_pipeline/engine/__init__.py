"""One process's run: the Runner and the feed, sink and tracker it takes, the reader, the recorder, the
set-up, `--turns all` conversations, the summary and the metrics it serves.

May import: the base modules, tokens, http, rundir, progress, inputs, fleet, resume, send.
"""
