"""The recording a replay reads: telemetry records as bytes, in the order they were written.

* a spool directory (``isrwatch simulate --spool-dir``, the embedded default's spool);
* a file of telemetry records, one per line (``isrwatch simulate`` to stdout, a topic
  dumped with a console consumer); blank lines are skipped, every other line is a record
  (a bad one is counted as rejected by the replay, as the job would);
* the telemetry topic of a Kafka cluster, every partition from its first offset to the end
  offset it had when the replay started (the job's own consumer settings);
* a simulated scenario, run as fast as it computes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.spool import SpoolReader

__all__ = ["read_recording", "read_topic", "simulated"]

log = logging.getLogger(__name__)


def _file_records(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        for line in fh:
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield line


def read_recording(path: str) -> Iterator[bytes]:
    """Every record of the spool directory or line file at ``path``, in order (checked first:
    ConfigError when there is nothing to read)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--input {path}: no such file or directory")
    if p.is_dir():
        reader = SpoolReader(p)
        end = reader.end_offset()
        if end == 0:
            raise ConfigError(f"--input {path}: a directory, but no spool segments (<start>-<end>.jsonl) in it")
        return (r for _, r in reader.read(0, end))
    return _file_records(p)


# A partition whose leader sends nothing for this long while records are still due: the
# replay stops with the partitions it could not read (a recording with a hole would
# answer a what-if question wrongly).
_STALL_S = 60.0


def read_topic(bootstrap_servers: str, topic: str, kafka_config: dict[str, str]) -> Iterator[bytes]:
    """Every record of ``topic``, from each partition's low watermark to its high watermark
    at the start (a null value as ``b""``). UnreachableError / ConfigError with the reason."""
    from confluent_kafka import Consumer, TopicPartition

    from isrwatch.exceptions import UnreachableError
    from streaming.sources.source_kafka import consumer_config, describe_topic, rdlog

    options = {"kafka.bootstrap.servers": bootstrap_servers, **{f"kafka.{k}": v for k, v in kafka_config.items()}}
    _, low, high = describe_topic(options, topic, timeout_s=30.0)
    if not high.get(topic):
        raise ConfigError(f"topic {topic} on {bootstrap_servers}: missing, or no partition leader answered")
    due = {int(p): (low[topic].get(p, 0), hi) for p, hi in high[topic].items() if hi > low[topic].get(p, 0)}
    total = sum(hi - lo for lo, hi in due.values())
    log.info(kv(event="replay_reading_topic", topic=topic, partitions=len(high[topic]), records=total))
    consumer = Consumer({**consumer_config(options), "auto.offset.reset": "earliest", "logger": rdlog})
    read = 0
    nexts = {p: lo for p, (lo, _) in due.items()}
    try:
        consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _) in due.items()])
        last_progress = time.monotonic()
        while any(nexts[p] < due[p][1] for p in due):
            m = consumer.poll(1.0)
            if m is None or m.error() is not None:
                if time.monotonic() - last_progress > _STALL_S:
                    late = sorted(p for p in due if nexts[p] < due[p][1])
                    raise UnreachableError(
                        f"topic {topic}: partitions {late} sent nothing for {_STALL_S:.0f} s "
                        f"({total - read} records still due); is their leader up?"
                    )
                continue
            p, offset = m.partition(), m.offset()
            if p is None or offset is None or p not in due or offset >= due[p][1]:
                continue
            nexts[p] = offset + 1
            last_progress = time.monotonic()
            read += 1
            yield m.value() or b""  # a null value: rejected by the parser as empty_value
    finally:
        consumer.close()


def simulated(scenario: str, duration_s: float, seed: int, interval_ms: int, mode: str) -> Iterator[bytes]:
    """The telemetry of ``scenario`` over ``duration_s`` simulated seconds, computed without
    waiting: rounds every ``interval_ms`` (``mode`` poll, as the collector) or one observation
    per follower fetch (``mode`` fetch, what the leader itself sees)."""
    from simulator.run import iter_records  # the simulator only for --simulate (demo wiring)

    rounds = iter_records(scenario, seed=seed, duration_s=duration_s, interval_ms=interval_ms, mode=mode)
    return (r for _, batch in rounds for r in batch)
