"""What a run counts and shows while it runs: RunStats, the progress bar or log line, alerts, cost, and
samples that came back identical.

May import: the base modules.
"""
