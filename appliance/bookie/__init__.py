"""Room of the bookie process (``python -m appliance.bookie``).

* ``server``: boot (storage, cookies, the BP-46 boot rule), serve, shut down;
* ``handler``: the ops a bookie answers, over the pure ``BookieCore`` and
  ``storage``; replies to adds only once durable;
* ``add_check``: cheap checks of packed adds before they are stored;
* ``disk_monitor``: read-only beyond the configured disk use;
* ``ledger_gc``: forgets deleted ledgers, deletes over-replicated ones after a
  grace period, and removes entry logs that hold only deleted ledgers.
"""
