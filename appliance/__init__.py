"""The BookKeeper appliance: client binding, bookie server and supervisor.

Rooms by runtime role: ``appliance.protocol`` (the pure core and the
kernel every layer shares), ``client``, ``bookie``, ``supervisor``,
``meta``, ``checks``, ``rereplication``, ``spark``, ``bench``; the
config (``appliance.config``) is shared by all.  README.md "Layout" gives
the layer rule.

Importing ``appliance`` is cheap and pulls in no sockets: the heavier
modules load on first use (``storage`` and ``ipc`` import
``appliance.protocol``, which must not drag the client in).
"""

from appliance.protocol.logs import DLSN

__version__ = "0.1.0"
__all__ = ["DLSN", "connect"]


def connect(target, metrics=False):
    """Connect to an appliance: a config file path or a metadata URI.
    Returns a ``appliance.client.client.Client`` (a context manager).
    ``metrics=True`` registers the client's Prometheus metrics in
    ``prometheus_client``'s default registry (or pass a ``CollectorRegistry``):
    docs/OBSERVABILITY.md."""
    from appliance.client.client import connect as _connect

    return _connect(target, metrics)
