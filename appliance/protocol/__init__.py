"""The replication protocol as pure state machines (stdlib only: no sockets,
files, clocks or randomness).  Drivers feed it events and carry out the
actions it returns; the deterministic simulation in ``tests/sim`` drives the
same code."""
