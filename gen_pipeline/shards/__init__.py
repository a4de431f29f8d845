"""Claimed shards: the claim protocol, a claimer's feed and sink, the claimer's run, and the `--workers`
supervisor that starts claimers.

May import: the base modules, tokens, http, rundir, progress, inputs, fleet, resume, send, engine.
"""
