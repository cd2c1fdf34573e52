"""A local SparkSession set up the way the equeue source needs it (used by the jobs and the bench).

Spark's Python workers must run this interpreter (the one with pyarrow and equeue installed), and
on hosts whose name does not resolve Spark must bind to loopback; both are environment variables
read when the JVM starts, so they are set here before the session is built.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def prepare_environment() -> None:
    """Set PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON to this interpreter and SPARK_LOCAL_IP to
    127.0.0.1 unless the user already set them."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def get_session(master: str = "local[*]", app_name: str = "equeue", shuffle_partitions: int = 4,
                extra_conf: dict[str, str] | None = None, filter_pushdown: bool = False) -> Any:
    """getOrCreate a session with the equeue source registered; reuses a running one.

    filter_pushdown sets spark.sql.python.filterPushdown.enabled, so reads prune by pushed filters;
    off by default because pyspark 4.3 then reuses one DataFrame's last pushed plan for its later
    unfiltered actions (docs/spark.md, "Filter pushdown")."""
    prepare_environment()
    from equeue_spark import register
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1"))
    if filter_pushdown:
        builder = builder.config("spark.sql.python.filterPushdown.enabled", "true")
    for k, v in (extra_conf or {}).items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
