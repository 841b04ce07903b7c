"""The log service (seed 003's write proxy): log server processes that own
logs through a lease in the metadata store and write the records of many
producers into them, exactly once.

``appliance.logservice.server`` is the process (``python -m
appliance.logservice``); ``appliance.logservice.owned`` one owned log;
the pure rules (spread, duplicate filter, wire) are
``appliance.protocol.log_service``; the producers' side is
``appliance.logs.producer``; the records in the metadata store
``appliance.meta.logservice``.  docs/LOGS.md, "The log service", is the
user's guide.
"""
