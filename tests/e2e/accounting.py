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
from tests.e2e.kafka_io import end_offsets, read_records
from tests.e2e.pipeline import Pipeline, until

__all__ = ["telemetry_counts", "committed_offsets", "drain_and_count"]


def telemetry_counts(cluster, topic: str, ends: dict[int, int] | None = None) -> tuple[int, Counter]:
    """(records, observations per (topic, partition, broker_id)) of the telemetry topic, every
    partition, up to ``ends`` (per partition; None: its end offsets now)."""
    values = [value for *_, value in read_records(cluster, topic, ends=ends)]
    counts: Counter = Counter()
    for v in values:
        for o in decode_record(v or b"{}").observations:  # any version, the columns of 3 too
            counts[(o.topic, o.partition, o.broker_id)] += 1
    return len(values), counts


def committed_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """Per partition, the end offset of the aggregation query's last committed batch (empty before any)."""
    agg = checkpoint / "aggregates"
    commits = [int(n) for n in os.listdir(agg / "commits") if n.isdigit()] if (agg / "commits").is_dir() else []
    if not commits:
        return {}
    lines = (agg / "offsets" / str(max(commits))).read_text().splitlines()
    return {int(p): int(o) for p, o in json.loads(lines[-1]).get(topic, {}).items()}


def drain_and_count(cluster: Any, pipe: Pipeline, spark_reader: Callable[[], Any]) -> tuple[int, Counter, Counter]:
    """Stop the collector, wait for the job to commit every telemetry record a consumer can
    read then, stop the job (exit 0), then (telemetry records the job committed, observations
    on the topic per replica in those records, observations in the job's state per replica,
    read back with Spark's state reader).

    The topic is counted up to the offsets the job committed, not up to its end when the
    collector stopped: the collector produces with acks=1, so its last records can still be
    on their way to the followers then (under the high watermark a consumer sees) and reach
    the job a moment later. Every partition's committed end must cover what was readable."""
    from streaming.lifecycle.query import restore_aggregates

    assert pipe.collector is not None
    pipe.collector.stop()
    pipe.collector = None
    readable = end_offsets(cluster, pipe.telemetry_topic)

    def covered() -> bool:
        done = committed_offsets(pipe.checkpoint_dir, pipe.telemetry_topic)
        return all(done.get(p, 0) >= end for p, end in readable.items())

    until("the job to commit the end of the telemetry topic", covered, 240, pipe)
    assert pipe.job is not None
    assert pipe.job.stop() == 0, pipe.tails()
    committed = committed_offsets(pipe.checkpoint_dir, pipe.telemetry_topic)
    high, expected = telemetry_counts(cluster, pipe.telemetry_topic, ends=committed)
    rows = restore_aggregates(spark_reader(), str(pipe.checkpoint_dir))
    got = Counter({(r["topic"], r["partition"], r["broker_id"]): r["observations"] for r in rows})
    return high, expected, got
