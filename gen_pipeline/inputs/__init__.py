"""The input: the file as a stream (plain, gzip or zstd), each row validated (the one validator `prepare`
and `generate` share), the prompts in input order with what was skipped and why, and the common dataset
formats (OpenAI messages, ShareGPT, Alpaca, ...) read and turned into rows (formats.py, for `prepare` and
`generate`).

May import: the base modules, tokens, rundir.
"""
