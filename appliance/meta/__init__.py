"""Room of the cluster metadata model, on top of a store backend.

* ``ledgers``: ``LedgerManager``: ledger ids, ``LedgerMetadata`` records,
  every change through one read / transform / compare-and-swap loop;
* ``bookies``: ``BookieRegistry``: bookie registrations (ephemeral nodes)
  and the metadata copy of each bookie's cookie;
* ``records``: the checksummed envelope of every metadata record;
* ``update_loop``: ``MetadataUpdateLoop``, the one read / transform / CAS /
  retry loop every record change goes through, and its limits.

The stores themselves (SQLite, ZooKeeper, chosen by URI:
``storage.metadata.open_store``) give paths, versions, CAS and ephemeral
nodes, and know nothing of ledgers; see docs/METADATA.md.
"""
