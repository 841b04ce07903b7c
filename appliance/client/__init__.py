"""Room of the client binding, which lives in the user's process.

* ``client``: ``Client`` (``appliance.connect``): metadata, create / open /
  delete ledgers, recovery on open;
* ``write_handle`` / ``read_handle``: ``WriteHandle`` / ``ReadHandle``,
  each around one pure core;
* ``add_future``: ``AddFuture``, the future of one add (also the log
  writer's records);
* ``driver``: the one thread that runs the pure cores and the transport;
* ``calls``: the waits and argument checks the blocking calls share;
* ``bulk_read``: verified catch-up reads without an object per entry
  (``ReadHandle.read_chunks``, the Spark data source).

Guarantees are stated in each module; the summary is in ``client``.
"""
