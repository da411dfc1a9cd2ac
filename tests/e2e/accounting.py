"""Telemetry accounting for the e2e tests: what the telemetry topic holds against what
the job has committed and aggregated (nothing lost, nothing counted twice)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from isrwatch.telemetry import decode_record
from tests.e2e.kafka_io import read_topic
from tests.e2e.pipeline import Pipeline, until

__all__ = ["telemetry_counts", "committed_records", "drain_and_count"]


def telemetry_counts(cluster, topic: str) -> tuple[int, Counter]:
    """(records, observations per (topic, partition, broker_id)) of the telemetry topic, every partition."""
    values = read_topic(cluster, topic)
    counts: Counter = Counter()
    for v in values:
        for o in decode_record(v or b"{}").observations:  # any version, the columns of 3 too
            counts[(o.topic, o.partition, o.broker_id)] += 1
    return len(values), counts


def committed_records(checkpoint: Path, topic: str) -> int:
    """Telemetry records up to the aggregation query's last committed batch, over every partition (-1 before any)."""
    agg = checkpoint / "aggregates"
    commits = [int(n) for n in os.listdir(agg / "commits") if n.isdigit()] if (agg / "commits").is_dir() else []
    if not commits:
        return -1
    lines = (agg / "offsets" / str(max(commits))).read_text().splitlines()
    return sum(int(o) for o in json.loads(lines[-1]).get(topic, {}).values())


def drain_and_count(cluster: Any, pipe: Pipeline, spark_reader: Callable[[], Any]) -> tuple[int, Counter, Counter]:
    """Stop the collector, wait for the job to commit the end of the telemetry topic, stop
    the job (exit 0), then (telemetry records, observations on the topic per replica,
    observations in the job's state per replica, read back with Spark's state reader)."""
    from streaming.query import restore_aggregates

    assert pipe.collector is not None
    pipe.collector.stop()
    pipe.collector = None
    high, expected = telemetry_counts(cluster, pipe.telemetry_topic)
    until(
        "the job to commit the end of the telemetry topic",
        lambda: committed_records(pipe.checkpoint_dir, pipe.telemetry_topic) >= high,
        240,
        pipe,
    )
    assert pipe.job is not None
    assert pipe.job.stop() == 0, pipe.tails()
    rows = restore_aggregates(spark_reader(), str(pipe.checkpoint_dir))
    got = Counter({(r["topic"], r["partition"], r["broker_id"]): r["observations"] for r in rows})
    return high, expected, got
