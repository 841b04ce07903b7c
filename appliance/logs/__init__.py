"""Logs on ledgers (seed 003): named, never-ending streams of records with
one writer, tailing readers and truncation from the front.

``bk.log(name)`` (``appliance.logs.connection``) gives a ``Log`` (``appliance.logs.log``); its
``writer()`` (``appliance.logs.writer``) and ``reader()``
(``appliance.logs.reader``) are the runtime over the pure rules in
``appliance.protocol.logs`` (metadata transitions, positions, rollover) and
``appliance.protocol.log_entry`` (records packed in an entry).  The log's
metadata is in the same CAS store as the ledgers (``appliance.meta.logs``).
docs/LOGS.md is the user's guide.
"""
