"""The embedded default's telemetry source: a PySpark Python streaming data
source over a spool directory (``isrwatch.spool``, written by the simulator).

Format name ``isrwatch-spool``; options ``path`` (the spool directory) and
``maxRecordsPerTrigger``. Offsets are ``{"offset": N}`` (record index in the
spool), checkpointed by Spark like Kafka offsets, so a restarted query
re-reads exactly the range it had planned. Rows have the columns of Spark's
Kafka source (key, value, topic, partition, offset, timestamp) and are handed
to Spark as Arrow record batches: the JSON is parsed in the JVM, not here.

Python's data source API has no admission control before Spark 4.2, so the
reader caps ``latestOffset`` itself: it remembers the end of the last range
Spark planned (``partitions`` is also how Spark tells a restarted reader
where the checkpoint stopped) and never offers more than
``maxRecordsPerTrigger`` records past it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streaming.sources.worker_path import quiet_zip_invalidation

# Loaded in Spark's Python workers to read telemetry: every later task of the worker is
# spared re-reading the directories of the zips on its import path (streaming.sources.worker_path).
quiet_zip_invalidation()

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from isrwatch.spool import SpoolReader

__all__ = ["FORMAT", "RAW_SCHEMA", "SpoolDataSource", "SpoolStreamReader", "raw_arrow_schema", "register"]

FORMAT = "isrwatch-spool"

# The columns of Spark's Kafka source, so the job does not care where records come from.
RAW_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
    ]
)


def raw_arrow_schema() -> pa.Schema:
    """``RAW_SCHEMA`` as the Arrow schema of the record batches a read task hands Spark."""
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


# Records per Arrow batch handed to Spark.
_ARROW_ROWS = 4096
# Records per input partition (one Spark task each).
_SPLIT_ROWS = 50_000


class SpoolRange(InputPartition):
    """Records [start, end) of the spool: one Spark task."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


# Where the spool is read to, as Spark keeps it in the checkpoint: {"offset": records before it}
SpoolOffset = dict[str, int]


def _offset(value: SpoolOffset | None) -> int:
    if not value:
        return 0
    return int(value["offset"])


class SpoolStreamReader(DataSourceStreamReader):
    def __init__(self, path: str, max_records: int) -> None:
        self.path = path
        self.max_records = max_records
        # End of the last range Spark planned. A new query asks latestOffset()
        # before initialOffset(); a restarted one first tells the reader where
        # its checkpoint stopped, through partitions(seen, seen).
        self._planned = 0

    def _reader(self) -> SpoolReader:
        from isrwatch.spool import SpoolReader

        return SpoolReader(self.path)

    def initialOffset(self) -> SpoolOffset:
        self._planned = 0
        return {"offset": 0}

    def latestOffset(self) -> SpoolOffset:
        end = min(self._reader().end_offset(), self._planned + self.max_records)
        return {"offset": max(end, self._planned)}

    def partitions(self, start: SpoolOffset, end: SpoolOffset) -> Sequence[InputPartition]:
        lo, hi = _offset(start), _offset(end)
        self._planned = max(self._planned, hi)
        return [SpoolRange(s, min(hi, s + _SPLIT_ROWS)) for s in range(lo, hi, _SPLIT_ROWS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        assert isinstance(partition, SpoolRange)
        topic = f"spool:{self.path}"
        schema = raw_arrow_schema()
        offsets: list[int] = []
        values: list[bytes] = []

        def batch() -> pa.RecordBatch:
            n = len(offsets)
            return pa.RecordBatch.from_arrays(
                [
                    pa.nulls(n, pa.binary()),
                    pa.array(values, pa.binary()),
                    pa.array([topic] * n, pa.string()),
                    pa.array([0] * n, pa.int32()),
                    pa.array(offsets, pa.int64()),
                    pa.nulls(n, pa.timestamp("us", tz="UTC")),
                ],
                schema=schema,
            )

        for offset, value in self._reader().read(partition.start, partition.end):
            offsets.append(offset)
            values.append(value)
            if len(offsets) >= _ARROW_ROWS:
                yield batch()
                offsets, values = [], []
        if offsets:
            yield batch()

    def commit(self, end: SpoolOffset) -> None:
        # The spool is append-only and kept whole (the simulator owns its files).
        self._planned = max(self._planned, _offset(end))


class SpoolDataSource(DataSource):
    """``spark.readStream.format("isrwatch-spool").option("path", DIR).load()``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return RAW_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        path = self.options.get("path")
        if not path:
            raise ValueError(f"{FORMAT}: option path (the spool directory) is required")
        max_records = int(self.options.get("maxRecordsPerTrigger") or self.options.get("maxrecordspertrigger") or 0)
        return SpoolStreamReader(path, max_records if max_records > 0 else 2**62)


def register(spark: SparkSession) -> None:
    spark.dataSource.register(SpoolDataSource)
