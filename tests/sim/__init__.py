"""Deterministic fault simulation of the replication protocol.

N simulated bookies (the real ``BookieCore`` over in-memory disks that lose
unsynced data on a crash), the real client cores (writer, recovering
openers, tailing readers), a CAS metadata store, a simulated clock and a
network that drops, delays, duplicates, reorders and partitions -- all
driven by one seed.  The invariants of BookKeeper's TLA+ model are checked
after every step (``tests.sim.checker``).

Run ``python -m tests.sim --seeds N [--seed S] [--disable PROTECTION]``.
"""
