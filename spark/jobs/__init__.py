"""Pipeline jobs over stored topics: `export` (incremental Parquet export) and `report` (lag/throughput).

Each has a `run(...)` function entry point; `equeue_spark.cli.main` wires them to `equeue spark ...`.
"""
