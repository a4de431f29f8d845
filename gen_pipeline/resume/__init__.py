"""Where a run goes on: is a row settled (settled.py: what earlier runs settled, read back, and one pass over the
input against it), the input cursor, the ledger's reasons read back (the reason that stands for each row the
output does not hold), the restart generations and the rejected answers spent.

May import: the base modules, rundir, inputs.
"""
