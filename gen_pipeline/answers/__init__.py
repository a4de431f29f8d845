"""Judging answers before they are kept: the loop guard that stops a repetition loop while it streams
(loops.py). It sits between send (which asks for answers) and the recorder (which keeps them).

May import: the base modules, http.
"""
