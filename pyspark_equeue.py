"""Lets `spark.read.format("equeue")` work with no registration call (PySpark looks up pyspark_* modules)."""

from equeue_spark.datasource import EQueueDataSource as DefaultSource  # noqa: F401
