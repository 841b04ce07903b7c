"""Automatic re-replication (BookKeeper's autorecovery): an auditor elected
through the metadata store marks under-replicated ledgers, replication
workers in the bookie processes heal them (``service``); the marks, locks
and switch live in the store (``marks``)."""
