"""A Spark driver of its own for the sink tests (a process the test can kill
with -9): streams log SOURCE into log TARGET through a slow map, ``BATCH``
records per trigger in 3 partitions (on 2 cores, so the target holds part
of a batch while its last partition runs), with a checkpoint,
until everything there at its start is written (``availableNow``).

    python -m tests.spark.sink_driver CONFIG SOURCE TARGET CHECKPOINT BATCH
"""

from __future__ import annotations

import os
import sys
import time

ROW_DELAY_S = 0.01  # per row: a batch takes seconds, so the test can kill it half written
QUERY_TIMEOUT_S = 600  # the test kills it or waits for it; this only ends a forgotten one


def main(config: str, source: str, target: str, checkpoint: str, batch: int) -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf

    from appliance.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("bookkeeper-sink-driver")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    @udf("binary")
    def slow(payload):
        time.sleep(ROW_DELAY_S)
        return b"copied " + bytes(payload)

    stream = (spark.readStream.format("bookkeeper").option("config", config)
              .option("log", source).option("maxRecordsPerTrigger", str(batch))
              .option("minPartitions", "3").load())  # 3 tasks on 2 cores: one runs last
    query = (stream.select(slow("payload").alias("payload")).writeStream.format("bookkeeper")
             .option("config", config).option("log", target)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(QUERY_TIMEOUT_S)
        error = query.exception()
    finally:
        query.stop()
        spark.stop()
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(*args[:4], int(args[4])))
