"""Fixtures for the Spark tests: one local[2] SparkSession for the whole run,
and a real appliance (bookie processes) per module with known ledgers.
Everything started here is stopped here, also when a test fails."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.launch import Cluster, wait_registered

PASSWORD = b"spark-pw"


@contextmanager
def pushdown_source(spark):
    """The pushdown-capable source registered directly (``register`` may
    decline pushdown on this Spark: docs/SPARK.md), to test its pruning with
    a DataFrame loaded per query; the plain source again after."""
    from appliance.spark import PUSHDOWN_CONF, BookKeeperPushdownDataSource, register

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(BookKeeperPushdownDataSource)
    try:
        yield spark
    finally:
        spark.conf.set(PUSHDOWN_CONF, "false")
        register(spark)


@pytest.fixture(scope="session")
def spark():
    """A local[2] session; the Python workers run this venv's interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("bookkeeper-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.python.worker.reuse", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@dataclass
class Appliance:
    """A running appliance and what was written to it."""

    cluster: Cluster
    client: object
    payloads: dict[int, list[bytes]] = field(default_factory=dict)  # ledger -> entries
    closed: set[int] = field(default_factory=set)
    open_writers: dict[int, object] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  # the test's names for ledgers

    @property
    def config(self) -> str:
        return str(self.cluster.config_path)

    def write(self, n: int, close: bool = True, size: int = 100, uniform: bool = False,
              **kw) -> int:
        """A ledger of ``n`` distinct entries of about ``size`` bytes (exactly
        ``size`` if ``uniform``: the shape of a writer's batch)."""
        lh = self.client.create_ledger(password=PASSWORD, **kw)
        payloads = [_payload(lh.id, i, size, uniform) for i in range(n)]
        futures = [lh.add_async(p) for p in payloads]
        assert [f.result(timeout=120) for f in futures] == list(range(n))
        self.payloads[lh.id] = payloads
        if close:
            lh.close()
            self.closed.add(lh.id)
        else:
            self.open_writers[lh.id] = lh
        return lh.id


def _payload(ledger_id: int, entry_id: int, size: int, uniform: bool = False) -> bytes:
    """Distinct bytes per (ledger, entry), of varying length around ``size``
    (of exactly ``size`` if ``uniform``)."""
    head = b"%d/%d:" % (ledger_id, entry_id)
    if uniform:
        return (head + bytes((entry_id * 7 + k) % 251 for k in range(size)))[:size]
    return head + bytes((entry_id * 7 + k) % 251 for k in range(size - 5 + entry_id % 11))


@pytest.fixture(scope="module")
def appliance_factory():
    """Factory for module-scoped appliances: ``make(n_bookies, **config_sections)``;
    all stopped after."""
    made: list[tuple[Path, Appliance]] = []

    def make(n_bookies: int = 3, **config_sections) -> Appliance:
        import appliance

        root = Path(tempfile.mkdtemp(prefix="bks"))  # ipc:// paths must stay short
        cluster = Cluster(root, n_bookies, **config_sections)
        app = Appliance(cluster, None)
        made.append((root, app))
        cluster.start()
        app.client = appliance.connect(str(cluster.config_path))
        wait_registered(app.client, n_bookies)
        return app

    try:
        yield make
    finally:
        for root, app in made:
            if app.client is not None:
                app.client.close()
            app.cluster.kill_all()
            shutil.rmtree(root, ignore_errors=True)
