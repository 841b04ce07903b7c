"""Room of the benchmarks behind ``bkctl bench`` (none of it runs in the
appliance itself).

* ``launcher``: the one launcher of temporary appliances and the one config
  writer (start, poll until ready, stop), for the benches and the tests;
* ``ledgers``: ``bkctl bench write|read``: durable adds and catch-up reads
  through the client binding, against a temporary appliance or a running one;
  its client processes' body is ``ledgers_client``, its results and plot
  ``ledgers_results``;
* ``metadata``: ``bkctl bench metadata``: the CAS stores, SQLite against a
  real ZooKeeper;
* ``spark``: ``bkctl bench spark``: the Spark data source against Parquet;
* ``zk_server``: a standalone ZooKeeperServer from pyspark's jars (``bkctl bench
  metadata|scale --backend zk``; the tests use it too).

The storage engine's own benchmark is ``storage.bench``; the wire's is
``ipc.bench``.  What only tests and developers run (the multi-host harness
on network namespaces, its ZooKeeper ensemble, delay relay and bench, the
A/B bookie bench) lives in ``tests/harness``: every module here is one a
``bkctl bench`` command runs (``tests/test_layers.py``).
"""
