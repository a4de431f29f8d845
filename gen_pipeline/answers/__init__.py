"""Judging answers before they are kept: the loop guard that stops a repetition loop while it streams
(loops.py), and the checks an answer must pass (checks.py: hygiene, --validate, --json-schema) with the
validator built from a run's flags (validate.py). It sits between send (which asks for answers and resamples
the rejected ones) and the recorder (which keeps them); nothing here sends, writes or counts.

May import: the base modules, http.
"""
