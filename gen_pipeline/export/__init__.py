"""`gen-pipeline export`: run directories become a training dataset (one row per sample, per prompt or per
conversation), or the OpenAI Batch API's result files, with a dataset card beside the data. Reads a run
directory (views/rundata.py, the ledger) and never changes it.

May import: the base modules, tokens, rundir, inputs, fleet, resume, views.
"""
