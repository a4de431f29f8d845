"""The servers: what each one is (discovery, provenance, capacity), its state, the health decisions, the
prober's I/O beside them, pacing, and the balancer that leases a slot.

May import: the base modules, tokens, http.
"""
