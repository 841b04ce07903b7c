"""Running a Markdown document's Python blocks in the test SparkSession, as a
reader would paste them (docs/SPARK.md; issue 48: its examples failed when
copied).

Each block runs on its own, in a fresh namespace holding only ``spark``
(blocks do not lean on each other: a reader may copy any one), with the
deployment paths the docs use mapped to the test's (``paths``: the docs'
``configs/local.toml`` to the test appliance's config, ``data/spark/`` to a
temporary folder); nothing else of the text is changed.  Then what the
block left is made to run, since Spark is lazy:

* every batch DataFrame it defined is read in full (the ``noop`` sink);
* every streaming query it started processes everything its sources hold
  now (``processAllAvailable``, within ``timeout_s``) and must not have
  failed;

and every query it started is stopped, also when it fails.  A failure is
one ``DocBlockFailed`` naming the block (``path:line``) and the error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tests.support.doc_blocks import Block


class DocBlockFailed(AssertionError):
    """A documented block that does not run as written."""


@dataclass
class BlockRun:
    """What a block left: rows of each batch DataFrame, input rows of each
    streaming query, by the block's variable names."""

    rows: dict[str, int] = field(default_factory=dict)
    streamed: dict[str, int] = field(default_factory=dict)


def run_block(block: Block, spark, paths: dict[str, str], timeout_s: float) -> BlockRun:
    """Run ``block`` (see the module docstring); ``DocBlockFailed`` if it
    does not run."""
    text = block.text
    for documented, here in paths.items():
        text = text.replace(documented, here)
    before = {q.id for q in spark.streams.active}
    namespace: dict = {"spark": spark}
    try:
        exec(compile(text, block.where, "exec"), namespace)  # noqa: S102 - the docs' own code
        return _settle(namespace, timeout_s)
    except Exception as exc:
        raise DocBlockFailed(f"{block.where}: {type(exc).__name__}: "
                             f"{_first_lines(str(exc))}") from exc
    finally:
        for query in spark.streams.active:
            if query.id not in before:
                query.stop()


def _settle(namespace: dict, timeout_s: float) -> BlockRun:
    """Run what the block defined (in the order it defined it)."""
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    run = BlockRun()
    for name, value in list(namespace.items()):
        if isinstance(value, DataFrame) and not value.isStreaming:
            value.write.format("noop").mode("overwrite").save()
            run.rows[name] = value.count()
        elif isinstance(value, StreamingQuery):
            _process_available(value, timeout_s)
            run.streamed[name] = sum(p.numInputRows for p in value.recentProgress)
    return run


def _process_available(query, timeout_s: float) -> None:
    """``processAllAvailable`` with a deadline (it has none of its own): the
    query is stopped and this fails if it takes longer."""
    done, errors = threading.Event(), []

    def process() -> None:
        try:
            query.processAllAvailable()
        except Exception as exc:  # the query failed: raised below, in the test's thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=process, daemon=True).start()
    if not done.wait(timeout_s):
        query.stop()
        raise TimeoutError(f"query {query.name or query.id} had not processed its input "
                           f"after {timeout_s} s")
    if errors:
        raise errors[0]
    if query.exception() is not None:
        raise query.exception()


def _first_lines(message: str, count: int = 3) -> str:
    """Spark's messages carry the JVM's stack: the first lines say what failed."""
    return "\n".join(message.strip().splitlines()[:count])
