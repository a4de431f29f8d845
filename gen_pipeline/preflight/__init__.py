"""`gen-pipeline check`: a preflight before any GPU hour is spent. It asks the fleet (each server up, its
limits and capacity), counts a few rows on every server, and dry-runs the engine's reader and budget over the
whole input (the plan), sending nothing.

May import: the base modules, tokens, http, rundir, progress, inputs, fleet, resume, send, engine, views, answers.
"""
