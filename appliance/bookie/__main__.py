"""``python -m appliance.bookie --config PATH --id BOOKIE``: one bookie."""

import sys

from appliance.bookie.server import main

sys.exit(main())
