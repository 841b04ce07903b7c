"""The replication protocol as pure state machines (stdlib only: no sockets,
files, clocks or randomness).  Drivers feed it events and carry out the
actions it returns; the deterministic simulation in ``tests/sim`` drives the
same code.

It is also the kernel of the layers above: the error tree with its stable
codes (``errors``, public as ``appliance.errors``), ``invariant`` and the
ledger model (``metadata``), which ``storage`` and ``ipc`` import.  Nothing
here imports anything outside the standard library and this package."""
