"""Room of the bookie process (``python -m appliance.bookie``).

* ``server``: boot (storage, cookies, the BP-46 boot rule), serve, shut down;
* ``handler``: the ops a bookie answers, over the pure ``BookieCore`` and
  ``storage``; replies to adds only once durable;
* ``add_check``: cheap checks of packed adds before they are stored;
* ``durable_watch``: the handler's replies follow the storage's durability,
  and none is acknowledged once the storage failed;
* ``disk_monitor``: read-only beyond the configured disk use;
* ``full_disk``: a write that finds the disk full turns the bookie
  read-only, it stays up and reopens its storage once there is room;
* ``exit_codes``: how a bookie process ends (78: a refusal a restart
  cannot change, which the supervisor does not restart);
* ``ledger_gc``: forgets deleted ledgers, deletes over-replicated ones after a
  grace period, and removes entry logs that hold only deleted ledgers; a
  pass on request (``bkctl bookie gc``).
"""
