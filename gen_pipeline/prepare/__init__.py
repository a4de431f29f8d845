"""`gen-pipeline prepare`: datasets in (read by inputs/formats.py), one deduplicated prompts JSONL out, each
row checked by the validator `generate` reads it with.

May import: the base modules, rundir, inputs.
"""
