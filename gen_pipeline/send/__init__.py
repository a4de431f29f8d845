"""Sending one prompt: its samples, the request path with its retries and re-made budgets, refusals
judged across the fleet, usage judged before it is believed, and the shapes of `--turns all` requests.

May import: the base modules, tokens, http, rundir, progress, inputs, fleet, answers.
"""
