"""Room of re-replication: restoring the write quorum of ledgers that name a
lost bookie.

* ``rereplicator``: ``Rereplicator`` (``bkctl bookie recover``) copies a lost
  bookie's share from surviving replicas and re-points fragments by CAS only
  after the replacement's durable acks; ``underreplicated`` lists what a
  lost bookie leaves one copy short.
* ``markers``: ``CopyMarkers``, the metadata-store marker held from before
  the first copy to a replacement until after the CAS that names it, so the
  replacement's garbage collector never deletes those copies as
  over-replicated.

What to copy and from where is pure code: ``appliance.protocol.rereplication_plan``.
"""
