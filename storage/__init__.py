"""One bookie's local storage (journal, entry logs, index, cookies) and the
metadata store backends."""
