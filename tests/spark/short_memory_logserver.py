"""A log server whose new owner of a log learns producers only from the
log's last completed segment (``LOG_SERVICE_REBUILD_MS`` 0 instead of
120 s): a test gets, without waiting minutes, the owner a log has when it
moves to another server long after a producer last wrote.

    python -m tests.spark.short_memory_logserver --config PATH --id ID
"""

from __future__ import annotations

import sys

from appliance.logservice.main import main
from appliance.protocol import limits

if __name__ == "__main__":
    limits.LOG_SERVICE_REBUILD_MS = 0  # read at each takeover (logservice.owned.learn_tail)
    sys.exit(main())
