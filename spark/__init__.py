"""equeue_spark: the `equeue` PySpark data source (batch/streaming read and write) and pipeline jobs.

`register(spark)` makes `spark.read.format("equeue")` available in a session. The top-level module
`pyspark_equeue` also exposes the source to PySpark's automatic lookup, which only finds it when that
module is importable from the Python path the Spark workers see (see docs/spark.md).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(session: Any) -> None:
    """Register the `equeue` data source on a SparkSession (idempotent)."""
    from equeue_spark.datasource import EQueueDataSource

    session.dataSource.register(EQueueDataSource)
