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


def connect(target, metrics=False, *, curve_key_file=None, trusted_keys_dir=None):
    """Connect to an appliance: a config file path or a metadata URI.
    Returns a ``appliance.client.client.Client`` (a context manager).
    ``metrics=True`` registers the client's Prometheus metrics in
    ``prometheus_client``'s default registry (or pass a ``CollectorRegistry``):
    docs/OBSERVABILITY.md.  ``curve_key_file`` (this client's CURVE key
    pair, a ``.key_secret`` file) and ``trusted_keys_dir`` (bookie public
    keys it trusts) turn on CURVE to tcp bookies without a config file:
    docs/SECURITY.md "Network: CURVE" and ``appliance.client.client.connect``."""
    from appliance.client.client import connect as _connect

    return _connect(target, metrics, curve_key_file=curve_key_file,
                    trusted_keys_dir=trusted_keys_dir)
