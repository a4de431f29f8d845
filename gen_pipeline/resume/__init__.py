"""Where a run goes on: the input cursor, and the ledger read back (the reason that stands for each row
the output does not hold).

May import: the base modules, rundir, inputs.
"""
