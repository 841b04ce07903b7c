"""The log server process: load the config, connect, serve until SIGTERM.

Exit codes: 0 after a clean stop (its logs closed, leases released), 2 when
it could not start (bad config, metadata unreachable, endpoint in use).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from appliance.client.client import raise_gc_threshold
from appliance.config import load_config
from appliance.curve import endpoint_curve
from appliance.errors import BKError
from appliance.heap import freeze_long_lived_objects
from appliance.logs.connection import Connection
from appliance.logservice.server import LogServer

# Python's youngest generation is collected every GC_YOUNG net allocations
# (700 by default; a larger [client] gc_threshold wins): every request and
# entry in flight is a few objects (futures, runs, callbacks) each young
# collection re-scanned, ~4% of the server's CPU at 8 synchronous producers.
GC_YOUNG = 50_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one log server.")
    parser.add_argument("--config", required=True)
    parser.add_argument("--id", required=True, help="the server's id, e.g. logserver-1")
    parser.add_argument("--endpoint", default=None,
                        help="ZeroMQ endpoint (default: ipc:// under the run folder)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        endpoint = args.endpoint or config.log_server_endpoint(args.id)
        curve = endpoint_curve(config, endpoint)  # tcp with [security] curve: the bookies' keys
        with Connection(args.config) as client:
            server = LogServer(client, args.id, endpoint,
                               stale_wait_ms=4 * config.metadata.session_timeout_ms,
                               metrics_address=config.log.metrics_address, curve=curve)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: server.stop())
            raise_gc_threshold(GC_YOUNG)
            freeze_long_lived_objects()  # full collections skip what startup made
            server.run()
    except BKError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0
