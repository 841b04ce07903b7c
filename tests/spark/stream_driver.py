"""A Spark driver of its own for the streaming tests (a process the test can
kill with -9): streams a log into Parquet, 400 records per trigger, with a
checkpoint, until the output holds ``until`` rows.

    python -m tests.spark.stream_driver CONFIG LOG PASSWORD OUT CHECKPOINT UNTIL
"""

from __future__ import annotations

import os
import sys
import time

DEADLINE_S = 600  # the test kills it or waits for it; this only ends a forgotten one


def main(config: str, log: str, password: str, out: str, checkpoint: str, until: int) -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from appliance.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("bookkeeper-stream-driver")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    stream = (spark.readStream.format("bookkeeper").option("config", config)
              .option("log", log).option("password", password)
              .option("maxRecordsPerTrigger", "400").load())
    query = (stream.writeStream.format("parquet").option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start(out))
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if query.awaitTermination(0.5):
            break  # failed: exception() below says why
        if _rows(spark, out) >= until:
            break
    error = query.exception()
    query.stop()
    spark.stop()
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr)
        return 1
    return 0


def _rows(spark, out: str) -> int:
    try:
        return spark.read.parquet(out).count()
    except Exception:  # noqa: BLE001 - no committed file yet
        return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(*args[:5], int(args[5])))
