"""The run directory: which files there are (layout), who may write them (locks), appending lines and
scanning them back (store), and the keys of the rows they hold (donekeys).

May import: the base modules.
"""
