"""A recording on its way to Spark: records written to Parquet files in chunks.

A week of telemetry does not fit in the driver's memory as one Python list, and Spark reads
files in parallel: ``stage`` writes the records ``CHUNK`` at a time (the Kafka source's columns,
offsets in recording order) under a directory the caller owns and removes, logging progress.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["CHUNK", "stage", "frame"]

log = logging.getLogger(__name__)

CHUNK = 20_000
_PROGRESS_EVERY = 100_000


def _table(records: list[bytes], first_offset: int) -> pa.Table:
    """The records in the Kafka source's columns (``streaming.sources.source_spool.raw_arrow_schema``)."""
    import pyarrow as pa

    from streaming.sources.source_spool import raw_arrow_schema

    n = len(records)
    return pa.table(
        [
            pa.nulls(n, pa.binary()),
            pa.array(records, pa.binary()),
            pa.array(["replay"] * n, pa.string()),
            pa.array([0] * n, pa.int32()),
            pa.array(range(first_offset, first_offset + n), pa.int64()),
            pa.nulls(n, pa.timestamp("us", tz="UTC")),
        ],
        schema=raw_arrow_schema(),
    )


def stage(records: Iterable[bytes], directory: str, what: str) -> int:
    """Write ``records`` under ``directory`` (Parquet, ``CHUNK`` a file); their number.
    ConfigError when there are none (``what`` names the recording in the message)."""
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    done, chunk = 0, []
    for record in records:
        chunk.append(record)
        if len(chunk) == CHUNK:
            pq.write_table(_table(chunk, done), os.path.join(directory, f"{done:012d}.parquet"))
            done += len(chunk)
            chunk = []
            if done % _PROGRESS_EVERY == 0:
                log.info(kv(event="replay_reading", records=done, recording=what))
    if chunk:
        pq.write_table(_table(chunk, done), os.path.join(directory, f"{done:012d}.parquet"))
        done += len(chunk)
    if not done:
        raise ConfigError(f"{what}: no telemetry records in it")
    log.info(kv(event="replay_read", records=done, recording=what))
    return done


def frame(spark: SparkSession, records: list[bytes]) -> DataFrame:
    """A few records as the Kafka source's columns, straight from memory (tests, small inputs)."""
    from streaming.sources.source_spool import RAW_SCHEMA

    return spark.createDataFrame(_table(records, 0), schema=RAW_SCHEMA)
