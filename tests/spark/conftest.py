"""Shared fixtures of the Spark tests: ONE local[2] SparkSession per test session (it takes ~6 s to
start), the installed store readers as a parameter, and real on-disk data written through each
store plugin's own MessageStore (the same code path the broker uses to append)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:  # tests.helpers.broker (the real broker process helper)
    sys.path.insert(0, REPO)

from equeue_core.plugins import get_plugin_manager  # noqa: E402


def installed_stores() -> list[str]:
    """Stores that have a reader and a writer installed (the read tests run over each)."""
    pm = get_plugin_manager()
    readers = set(pm.names("equeue_store_readers"))
    return sorted(readers & set(pm.names("equeue_store_engines")))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_name" in metafunc.fixturenames:
        metafunc.parametrize("store_name", installed_stores())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from equeue_spark.session import get_session

    session = get_session("local[2]", app_name="equeue-tests", shuffle_partitions=2,
                          extra_conf={"spark.default.parallelism": "2",
                                      "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"})
    yield session
    session.stop()


