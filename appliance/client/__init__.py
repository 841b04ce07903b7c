"""Room of the client binding, which lives in the user's process.

* ``client``: ``Client`` (``appliance.connect``): metadata, create / open /
  delete ledgers, recovery on open;
* ``handles``: ``WriteHandle`` / ``ReadHandle``, each around one pure core;
* ``driver``: the one thread that runs the pure cores and the transport;
* ``calls``: the waits and argument checks the blocking calls share;
* ``bulk_read``: verified catch-up reads without an object per entry
  (``ReadHandle.read_chunks``, the Spark data source).

Guarantees are stated in each module; the summary is in ``client``.
"""
