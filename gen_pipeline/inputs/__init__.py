"""The input: the file as a stream (plain, gzip or zstd), each row validated (the one validator `prepare`
and `generate` share), and the prompts in input order with what was skipped and why.

May import: the base modules, tokens, rundir.
"""
