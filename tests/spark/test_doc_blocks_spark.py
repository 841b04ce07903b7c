"""Every code block of docs/SPARK.md runs as written (issue 48: its examples
failed when copied), against a test appliance holding what the examples
name: ledgers 3, 4 and 5 with password "secret", a log ``orders`` of JSON
orders (no password, as logs written through the log service are) with
segments in cold storage, and a running log service for the sink examples.
A block that cannot run says why in the document (``doc-test: skip``): the
benchmark blocks, whose commands bkctl must still parse as written and
tests/spark/test_bench_cli.py must run on tiny sizes.
The runner (``tests.spark.doc_runner``) fails blocks broken on purpose: the
examples as they were before this test existed."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.cold.mover import offloader
from appliance.spark import register
from tests.logservice.support import LogServers
from tests.spark.doc_runner import DocBlockFailed, run_block
from tests.support.doc_blocks import blocks, parse
from tests.support.doc_run import check_bench_block

DOC = Path(__file__).resolve().parents[2] / "docs" / "SPARK.md"
QUERY_TIMEOUT_S = 300
ORDERS = [(f"c{i % 3}", i, i * 3) for i in range(60)] + [("late", 0, 600)]  # 3 minutes, then late


@pytest.fixture(scope="module")
def app(appliance_factory, spark):
    register(spark)
    app = appliance_factory(3, log={"segment_records_max": 25, "flush_interval_us": 200},
                            cold_storage={"uri": "cold", "delete_after_ms": 0})
    servers = LogServers(app.cluster, app.client)
    try:
        servers.start("logserver-1")
        _ledgers(app.client)
        _orders(app.client)
        yield app
    finally:
        servers.kill_all()


def _ledgers(client) -> None:
    """Closed ledgers with password "secret" up to id 5 (the examples name 3,
    4 and 5), each of 2,000 entries (the filter example reads 1000..1999)."""
    made: list[int] = []
    while max(made, default=-1) < 5:
        lh = client.create_ledger(password=b"secret")
        for f in [lh.add_async(b"entry %d" % i) for i in range(2000)]:
            f.result(timeout=60)
        lh.close()
        made.append(lh.id)
    assert {3, 4, 5} <= set(made)


def _orders(client) -> None:
    """Log ``orders``: JSON orders of three minutes and a late one (it moves
    the pipeline's watermark past them), its first segments moved cold."""
    with client.log("orders").writer() as w:
        for customer, amount, second in ORDERS:
            w.write(b'{"customer": "%s", "amount": %d, "ts": "2026-01-01T00:%02d:%02d"}'
                    % (customer.encode(), amount, second // 60, second % 60))
    segments = client.log("orders").metadata().live_segments
    assert len(segments) >= 3
    moved = offloader(client, b"").offload("orders", before=segments[-1].last_dlsn).moved
    assert moved == [s.seq for s in segments[:-1]]


def _paths(app, tmp_path: Path) -> dict[str, str]:
    return {"configs/local.toml": app.config, "data/spark/": f"{tmp_path}/data/"}


README = DOC.parents[1] / "README.md"
# README.md's Spark block (tests/integration/test_docs_run.py leaves it here)
README_SPARK = [b for b in blocks(README, ("python",)) if "register(spark)" in b.text]


def test_the_readme_has_its_spark_block_run_here():
    assert len(README_SPARK) == 1, README_SPARK


@pytest.mark.parametrize("block", blocks(DOC) + README_SPARK, ids=str)
def test_every_block_of_the_spark_doc_runs_as_written(spark, app, tmp_path, block):
    if block.skip_reason is not None:
        assert "test_bench_cli.py" in block.skip_reason, f"{block}: {block.skip_reason}"
        check_bench_block(block, [Path(__file__).parent / "test_bench_cli.py"])
        return
    assert block.lang == "python", \
        f"{block}: not Python: make it run here, or mark it <!-- doc-test: skip (why) -->"
    run = run_block(block, spark, _paths(app, tmp_path), QUERY_TIMEOUT_S)
    assert run.rows or run.streamed, f"{block}: leaves no DataFrame or query to run"
    assert all(run.rows.values()), f"{block}: a DataFrame with no row: {run.rows}"
    assert all(run.streamed.values()), f"{block}: a query that read nothing: {run.streamed}"


# The examples as they were (issue 48), each broken in its own way.
BROKEN = '''
```python
stream = (spark.readStream.format("bookkeeper")
          .option("config", "configs/local.toml")
          .option("log", "orders")
          .option("password", "secret")             # the log's password, if any
          .load())
query = (stream.writeStream.format("parquet")
         .option("checkpointLocation", "data/spark/checkpoints/orders-pw")
         .start("data/spark/orders-pw"))
```

```python
query = (stream_df.selectExpr("CAST(value AS BINARY) AS payload")
         .writeStream.format("bookkeeper")
         .option("config", "configs/local.toml").option("log", "enriched")
         .option("checkpointLocation", "data/spark/checkpoints/enriched-broken")
         .start())
```

```python
stream = (spark.readStream.format("bookkeeper").option("config", "configs/local.toml")
          .option("log", "orders").load())
query = stream.writeStream.format("parquet")...start(...)
```

```python
df = (spark.read.format("bookkeeper").option("config", "configs/local.toml")
      .option("log", "orders").load())
wrong = df.selectExpr("CAST(value AS BINARY) AS payload")
```
'''


@pytest.mark.parametrize("index, error", [
    (0, "log 'orders' has no password: remove option password"),
    (1, "NameError: name 'stream_df' is not defined"),
    (2, "SyntaxError"),
    (3, "UNRESOLVED_COLUMN"),
])
def test_the_runner_fails_a_block_broken_on_purpose_naming_it(spark, app, tmp_path, index,
                                                              error):
    block = parse(BROKEN, "broken.md")[index]
    with pytest.raises(DocBlockFailed, match=f"^broken.md:{block.line}: ") as info:
        run_block(block, spark, _paths(app, tmp_path), QUERY_TIMEOUT_S)
    assert error in str(info.value)
    assert not [q for q in spark.streams.active], "the runner left a query running"
