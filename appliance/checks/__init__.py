"""Room of the record checks the client side makes on what bookies return.

* ``digest``: per-ledger digests (CRC32C, HMAC-SHA256 keyed by the ledger's
  master key) over entry headers and payloads;
* ``record_check``: vectorised verification of many returned records at once
  (ids, lengths, digests), falling back to record-by-record to name a fault.

The vectorised CRC itself is ``storage.crc_vec``: bookies use it too.
"""
