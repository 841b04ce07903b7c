"""What ``appliance.connect`` returns: a ledger client (``Client``) with the
log layer on top (``bk.log(name)``, ``list_logs``, ``delete_log``).

The log layer stands on the client (a log's segments are ledgers written
through it), so the client room knows nothing of logs and this class, one
room up, joins them.  It adds no state and no threads of its own: its
guarantees are the client's and the log handle's (``appliance.logs.log``).
"""

from __future__ import annotations

from appliance.client.client import Client, check_password_type, raise_process_settings
from appliance.logs.log import Log


class Connection(Client):
    """A connection to one appliance: its ledgers and its logs."""

    def log(self, name: str, password: bytes = b"") -> Log:
        """A handle on the log ``name`` (``appliance.logs.log.Log``); the log
        is created by its first writer.  ``password`` protects its segments'
        ledgers (every writer and reader of the log must give the same)."""
        self._check_open()
        return Log(self, self.logs, name, check_password_type(password), self.log_config)

    def list_logs(self) -> list[str]:
        self._check_open()
        return self.logs.list_logs()

    def delete_log(self, name: str, password: bytes = b"") -> None:
        """Delete a log: its writer is fenced, its segments' ledgers and its
        metadata removed.  ``NoSuchLogError`` if there is none."""
        self.log(name, password).delete()


def connect(target, metrics=False, *, curve_key_file=None, trusted_keys_dir=None) -> Connection:
    """Connect to an appliance: a config file path, or a metadata URI
    (``sqlite:///...``, ``zk://host:port/chroot``).  ``metrics``: True (the
    ``prometheus_client`` default registry) or a ``CollectorRegistry``
    registers the client's metrics (``appliance.client.metrics``).

    CURVE (docs/SECURITY.md, "Network: CURVE"), for bookies on tcp
    endpoints, without a config file or overriding its ``[security]``:
    ``curve_key_file`` is this client's key pair (a ``.key_secret`` file of
    ``bkctl keys generate``, owner-only); ``trusted_keys_dir`` (optional) a
    directory of bookie public keys: a bookie whose registered key is not
    there is refused and treated as unavailable.  A bookie that does not
    accept this client's key fails requests with ``UnauthorizedError``
    naming it.  A bad key file raises ``ConfigError`` here.

        appliance.connect("zk://10.0.0.5:2181/appliance",
                          curve_key_file="keys/app.key_secret",
                          trusted_keys_dir="keys/bookies")
    """
    client = Connection(target, metrics, curve_key_file=curve_key_file,
                        trusted_keys_dir=trusted_keys_dir)
    # process-wide settings, for an application's connection only (a
    # bookie's own client for its repairs leaves the bookie's as they are)
    raise_process_settings(client.config.gc_threshold, client.config.switch_interval_us)
    return client
