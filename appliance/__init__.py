"""The BookKeeper appliance: client binding, bookie server and supervisor.

Importing ``appliance`` is cheap and pulls in no sockets: the heavier
modules load on first use.
"""

__version__ = "0.1.0"


def connect(target):
    """Connect to an appliance: a config file path or a metadata URI.
    Returns a ``appliance.client.client.Client`` (a context manager)."""
    from appliance.client.client import connect as _connect

    return _connect(target)
