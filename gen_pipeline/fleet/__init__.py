"""The servers: what each one is (discovery, provenance, capacity), its state, the health decisions, the
prober's I/O beside them, pacing, the balancer that leases a slot and the queue of leases waiting for one.

May import: the base modules, tokens, http.
"""
