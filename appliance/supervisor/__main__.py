"""``python -m appliance.supervisor --config PATH``: run a config's bookies."""

import sys

from appliance.supervisor.supervisor import main

sys.exit(main())
