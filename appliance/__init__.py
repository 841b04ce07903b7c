"""The BookKeeper appliance: client binding, bookie server and supervisor.

Importing ``appliance`` is cheap and pulls in no sockets: the heavier
modules load on first use.
"""

__version__ = "0.1.0"
