"""The appliance's error tree, under its public name (``from appliance.errors
import LedgerFencedError``; see ../shared/CONTRACT.md).

The classes live in ``appliance.protocol.errors``, the stdlib-only kernel, so
that ``storage`` and ``ipc`` can raise them without importing upward; this
module re-exports every public name of it (the same class objects).
"""

from appliance.protocol.errors import *  # noqa: F403
from appliance.protocol.errors import __all__  # noqa: F401
