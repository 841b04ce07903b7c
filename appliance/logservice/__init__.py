"""The log service (seed 003's write proxy): log server processes that own
logs through a lease in the metadata store and write the records of many
producers into them, exactly once.

``appliance.logservice.server`` is the process (``python -m
appliance.logservice``): one loop thread serves the socket and drives every
owned log; ``appliance.logservice.owned`` drives one owned log's core
(``appliance.protocol.log_owner``: its filter, group commit, control
entries, hand-over, answers); ``appliance.logservice.routing`` looks up the
owners of logs not owned here, off the loop; ``readcache`` serves tailing
readers on its own thread.  Each module's docstring names the thread that
owns each of its structures.  The pure rules (spread, duplicate filter,
wire) are ``appliance.protocol.log_service``; the producers' side is
``appliance.logs.producer``; the records in the metadata store
``appliance.meta.logservice``.  docs/LOGS.md, "The log service", is the
user's guide.
"""
