"""The BookKeeper appliance: client binding, bookie server and supervisor.

Rooms by runtime role: ``appliance.protocol`` (the pure core and the
kernel every layer shares), ``client``, ``bookie``, ``supervisor``,
``meta``, ``checks``, ``rereplication``, ``spark``, ``bench``; the
config (``appliance.config``) is shared by all.  docs/DEVELOPING.md "Layout" gives
the layer rule.

Importing ``appliance`` is cheap and pulls in no sockets: the heavier
modules load on first use (``storage`` and ``ipc`` import
``appliance.protocol``, which must not drag the client in).
"""

from appliance.protocol.logs import DLSN

__version__ = "0.1.0"
__all__ = ["DLSN", "connect"]


def connect(target, metrics=False, *, curve_key_file=None, trusted_keys_dir=None):
    """Connect to an appliance: a config file path or a metadata URI.
    Returns an ``appliance.logs.connection.Connection``: a ledger client
    (``appliance.client.client.Client``) with the log layer, a context manager.
    ``metrics=True`` registers the client's Prometheus metrics in
    ``prometheus_client``'s default registry (or pass a ``CollectorRegistry``):
    docs/OBSERVABILITY.md.  ``curve_key_file`` (this client's CURVE key
    pair, a ``.key_secret`` file) and ``trusted_keys_dir`` (bookie public
    keys it trusts) turn on CURVE to tcp bookies without a config file:
    docs/SECURITY.md "Network: CURVE" and ``appliance.logs.connection.connect``."""
    # imported here, not at the top: ``storage`` and ``ipc`` import
    # ``appliance.protocol``, which runs this file first, and must not drag
    # the client, zmq and the metadata store in with it
    from appliance.logs.connection import connect as _connect

    return _connect(target, metrics, curve_key_file=curve_key_file,
                    trusted_keys_dir=trusted_keys_dir)
