"""``python -m appliance.logservice --config PATH --id ID``: one log server."""

import sys

from appliance.logservice.main import main

sys.exit(main())
