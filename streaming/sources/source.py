"""Where the job's telemetry comes from: one function returning the raw
stream (the Kafka source's columns), whatever the source.

* a spool directory (embedded simulator, or ``--spool-dir``):
  ``streaming.sources.source_spool`` (format ``isrwatch-spool``);
* a Kafka telemetry topic (``--bootstrap-servers``):
  ``streaming.sources.source_kafka`` (format ``isrwatch-kafka``), a Python data
  source over confluent-kafka, since the JVM Kafka connector jar is not
  available everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from isrwatch.settings import kafka_config_pairs
from streaming.sources.source_spool import FORMAT as SPOOL_FORMAT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from streaming.settings import JobSettings

__all__ = ["spool_stream", "kafka_stream"]


def spool_stream(spark: SparkSession, path: str, max_records_per_trigger: int) -> Callable[[str], DataFrame]:
    def raw(query: str) -> DataFrame:
        return (
            spark.readStream.format(SPOOL_FORMAT)
            .option("path", path)
            .option("maxRecordsPerTrigger", str(max_records_per_trigger))
            .load()
        )

    return raw


def kafka_stream(spark: SparkSession, settings: JobSettings, checkpoint_dir: str) -> Callable[[str], DataFrame]:
    """The telemetry topic, one reader per query; a query's reader keeps its deferred
    ranges (``streaming.sources.deferred``) in ``<checkpoint_dir>/source-<query>``."""

    from streaming.sources import source_kafka

    source_kafka.register(spark)
    fmt = source_kafka.FORMAT
    extra = kafka_config_pairs(settings.kafka_config)

    def raw(query: str) -> DataFrame:
        reader = (
            spark.readStream.format(fmt)
            .option("kafka.bootstrap.servers", settings.bootstrap_servers or "")
            .option("subscribe", settings.telemetry_topic)
            .option("startingOffsets", settings.starting_offsets)
            .option("maxRecordsPerTrigger", str(settings.max_records_per_trigger))
            .option("partitionAnswerMs", str(settings.partition_answer_ms))
            .option("stateDir", os.path.join(checkpoint_dir, f"source-{query}"))
        )
        for k, v in extra.items():
            reader = reader.option(f"kafka.{k}", v)
        return reader.load()

    return raw
