"""Issue 14's first finding, as a regression: records of random bytes produced
to the real telemetry topic while the real pipeline runs.

Before the fix the job's side query (since folded into its one query) failed on the first record that was not UTF-8
(``UnicodeDecodeError`` turning the dead letters into Python strings), the job
exited (``query isrwatch_side stopped``) with nothing dead-lettered, and its
checkpoint still pointed before the record, so every restart failed again.

Real parts: the shared 3-broker Kafka 0.9 cluster, ``isrwatch collect`` and
``isrwatch run --bootstrap-servers`` as processes (``tests.e2e.pipeline``).

* every poison record (random bytes, not UTF-8, empty and null values, null
  and binary keys, truncated telemetry, JSON nested 10,000 deep, ~900 KB) is
  one dead letter on the dead-letter topic with a reason, and its payload
  decodes back to the record's bytes (a prefix, size and hash when too big
  for one dead letter);
* the job keeps running and keeps evaluating the collector's telemetry;
* the same records produced again and the job killed (SIGKILL) inside the batch
  that reads them (its offsets planned, not committed): restarted on the same
  checkpoint, it reads them again, dead-letters them and keeps running; the
  first ones, committed before the crash, are not dead-lettered twice.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from streaming.evaluation.parse import REASONS, RECORD_REASONS, payload_kept_bytes
from streaming.lifecycle.origin import QUERY_DIR
from streaming.settings import JobSettings
from streaming.sinks.outputs import payload_bytes
from tests.e2e.kafka_io import end_offsets, produce_waiting, read_topic
from tests.e2e.pipeline import TOPIC_PARTITIONS, Pipeline, until

# A campaign (three job starts on real Kafka, 5-8 min): make test keeps poison records on real Kafka
# through tests/e2e/test_steady_load.py (bad telemetry on the real topic, dead-lettered).
pytestmark = pytest.mark.campaign

SEED = 14
# What the pipeline's job keeps of a big bad record: its default cap's share (parse.payload_kept_bytes).
KEPT_BYTES = payload_kept_bytes(JobSettings().max_records_per_trigger)


def poison_values() -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) pairs, seeded: none of them is telemetry."""
    rng = random.Random(SEED)
    telemetry = json.dumps(
        {"version": 1, "cluster": "e2e", "source": "test", "sent_ms": 1, "observations": []}
    ).encode()
    fixed: list[bytes | None] = [
        b"\xff\xfe",
        b"",
        None,
        b"\xed\xa0\x80",  # a lone surrogate, UTF-8 encoded
        b"\xc0\x80",
        telemetry[: len(telemetry) // 2],
        telemetry.replace(b'"e2e"', b'"e2\xffe"'),
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
        rng.randbytes(900_000),  # under the 0.9 broker's message.max.bytes, over one dead letter
        b"\n\x00\r",
    ]
    values = fixed + [rng.randbytes(rng.randint(1, 300)) for _ in range(200)]
    keys = [None if i % 4 == 0 else rng.randbytes(rng.randint(0, 64)) for i in range(len(values))]
    return list(zip(keys, values, strict=True))


def produce(cluster, topic: str, records, partitions: int = TOPIC_PARTITIONS) -> dict[tuple[int, int], bytes | None]:
    """Produce the records, round robin over the first ``partitions``; (partition, offset) -> value
    of each, from the delivery reports."""
    producer = Producer(cluster.client_config(acks="all"))
    where: dict[tuple[int, int], bytes | None] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        where[(msg.partition(), msg.offset())] = msg.value()

    for i, (key, value) in enumerate(records):
        produce_waiting(producer, topic, key=key, value=value, partition=i % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(where) == len(records)
    return where


def dead_letters(cluster, pipe: Pipeline) -> list[dict]:
    return [json.loads(v) for v in read_topic(cluster, pipe.deadletter_topic) if v is not None]


def every(seconds: float, predicate: Callable[[], bool]) -> Callable[[], bool]:
    """``predicate`` evaluated at most once per ``seconds`` (each read of the topic is a new consumer)."""
    last = [0.0]

    def check() -> bool:
        if time.monotonic() - last[0] < seconds:
            return False
        last[0] = time.monotonic()
        return predicate()

    return check


def check_letter(d: dict, value: bytes | None) -> None:
    assert d["reason"] in REASONS and d["reason"] in RECORD_REASONS, d
    kept = payload_bytes(d)
    if d.get("payload_truncated"):
        assert value is not None and kept is not None and value.startswith(kept) and len(kept) == KEPT_BYTES
        assert d["payload_bytes"] == len(value)
        assert d["payload_sha256"] == hashlib.sha256(value).hexdigest()
    else:
        assert kept == value, d


def batch_reading(query: Path, topic: str, poison: dict[tuple[int, int], bytes | None]) -> int | None:
    """The first batch Spark has planned (``offsets/N`` written) whose range covers a poison record."""
    for f in sorted((query / "offsets").iterdir(), key=lambda f: int(f.name) if f.name.isdigit() else -1):
        if not f.name.isdigit():
            continue
        try:
            end = json.loads(f.read_text().splitlines()[-1]).get(topic, {})
        except (ValueError, IndexError):
            continue
        if any(int(end.get(str(p), 0)) > o for p, o in poison):
            return int(f.name)
    return None


def kill_inside_the_batch_reading(pipe: Pipeline, poison: dict[tuple[int, int], bytes | None]) -> int:
    """SIGKILL the job as soon as Spark has planned the batch that reads ``poison``, before
    that batch commits: the crash a poison record used to cause. Returns the batch id."""
    assert pipe.job is not None
    query = pipe.checkpoint_dir / QUERY_DIR
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        n = batch_reading(query, pipe.telemetry_topic, poison)
        if n is not None:
            pipe.job.kill()
            # a batch takes a second or more here; polled every 20 ms, it cannot have committed
            assert not (query / "commits" / str(n)).exists(), f"batch {n} committed before the kill"
            return n
        pipe.check_alive("a batch planned over the second poison")
        time.sleep(0.02)
    raise AssertionError("no batch planned over the second poison within 120 s")


def test_poison_records_are_dead_lettered_and_never_stop_the_job(kafka_cluster, unique_name, tmp_path) -> None:
    cluster = kafka_cluster
    cluster.create_topic(unique_name("poison-watched"), partitions=2, replication_factor=3)
    with Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(4)
        poison = produce(cluster, pipe.telemetry_topic, poison_values())

        def letters_by_position() -> dict[tuple[int, int], list[dict]]:
            out: dict[tuple[int, int], list[dict]] = {}
            for d in dead_letters(cluster, pipe):
                assert d["source_topic"] == pipe.telemetry_topic
                out.setdefault((d["source_partition"], d["source_offset"]), []).append(d)
            return out

        until(
            "a dead letter for every poison record",
            every(5, lambda: set(letters_by_position()) >= set(poison)),
            240,
            pipe,
        )
        seen = len(pipe.batches())
        until("the job to go on evaluating", lambda: len(pipe.batches()) > seen + 2, 120, pipe)
        letters = letters_by_position()
        assert set(letters) == set(poison)
        for pos, value in poison.items():
            assert len(letters[pos]) == 1, letters[pos]
            check_letter(letters[pos][0], value)
        assert any(d.get("payload_truncated") for ds in letters.values() for d in ds), "the 900 KB record"
        assert {ds[0]["reason"] for ds in letters.values()} >= {"not_utf8", "empty_value", "not_json"}
        assert pipe.batches()[-1][1] > 0, "the collector's telemetry is still read"
        assert "UnicodeDecodeError" not in pipe.job_log()

        # The same records again, and the job killed inside the batch that reads them, before it
        # commits; restarted on the same checkpoint, it reads them again and goes on.
        second = produce(cluster, pipe.telemetry_topic, poison_values())
        crashed = kill_inside_the_batch_reading(pipe, second)
        pipe.start_job()

        until("the second poison dead-lettered", every(5, lambda: set(letters_by_position()) >= set(second)), 240, pipe)
        seen = len(pipe.batches())
        until("the restarted job to go on evaluating", lambda: len(pipe.batches()) > seen + 2, 120, pipe)
        letters = letters_by_position()
        assert set(letters) == set(poison) | set(second)
        for pos in poison:
            assert len(letters[pos]) == 1, f"committed before the crash, dead-lettered again: {letters[pos]}"
        for pos, value in second.items():
            # once; twice if the killed batch had already written it (a batch run again writes again)
            assert 1 <= len(letters[pos]) <= 2, letters[pos]
            for d in letters[pos]:
                check_letter(d, value)
        assert f"deadletters batch_id={crashed} " in pipe.job.log(), "the killed batch was run again"
        assert "UnicodeDecodeError" not in pipe.job_log()


@pytest.mark.parametrize(
    ("records", "size"),
    [(1200, 900_000), (16_000, 70_000)],
    ids=["1200-of-900KB", "16000-of-70KB"],
)
def test_a_flood_of_big_poison_records_is_dead_lettered_without_stopping_the_job(
    kafka_cluster, unique_name, tmp_path, records, size
):
    """A flood of random bytes (1.08 GB of 900 KB records, the 0.9 broker taking up to ~1 MB a
    record; or 1.12 GB of 70 KB records) on two partitions, written while the job is stopped, so
    that its first batches after the start read a cap's worth each. Before dead letters kept only
    a record's first 64 KiB, 400 of the big ones in a batch ran the job's JVM out of memory, and
    the restarted job again on the same batch; before the source handed Spark its records in
    Arrow batches of at most 16 MiB, the first flood did (two reads of 600 records, 540 MB each,
    at once: docs/benchmarks.md, "A flood of big records"). While each kept 64 KiB whatever the
    cap, the second did: 2,000 dead letters of 64 KiB in the driver's one Arrow job lost a task's
    result, then the query's restart ran the JVM out of heap, at every start; now a batch keeps
    its cap's share of ``parse.DEADLETTER_BATCH_BYTES`` of each. Each record gets its dead letter
    (first bytes, whole size and hash) and the job goes on evaluating."""
    cluster = kafka_cluster
    cluster.create_topic(unique_name("flood-watched"), partitions=2, replication_factor=3)
    rng = random.Random(SEED + 1)
    with Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(4)
        pipe.job.stop()  # a clean stop; the flood is then a backlog the next start reads at once
        flood = produce(cluster, pipe.telemetry_topic, [(None, rng.randbytes(size)) for _ in range(records)], 2)
        pipe.start_job()

        def letters() -> dict[tuple[int, int], dict]:
            return {(d["source_partition"], d["source_offset"]): d for d in dead_letters(cluster, pipe)}

        until("a dead letter for every record of the flood", every(15, lambda: set(letters()) >= set(flood)), 420, pipe)
        seen = len(pipe.batches())
        until("the job to go on evaluating", lambda: len(pipe.batches()) > seen + 2, 120, pipe)
        got = letters()
        for pos, value in flood.items():
            check_letter(got[pos], value)
            assert got[pos]["payload_truncated"] is True
        assert "OutOfMemoryError" not in pipe.job_log()
        assert pipe.batches()[-1][1] > 0, "the collector's telemetry is still read"


def test_a_fleets_telemetry_stamped_an_hour_ahead_is_dead_lettered_without_stopping_the_job(
    kafka_cluster, unique_name, tmp_path
):
    """A 100,000-replica fleet's collector with its clock an hour ahead: 2,000 of its records
    (500 observations each, telemetry version 3, 72 MB: ~3 minutes of that fleet's telemetry),
    written while the job is stopped, so that its first batch after the start reads them all:
    a million dead letters (``future_t``), one per observation. While the driver took the
    batch's dead letters in its one Spark job, the job's 1 GiB JVM ran out of heap at every
    start (docs/benchmarks.md, "A fleet's telemetry stamped an hour ahead"); now the executors
    write them (``streaming.sinks.letterwriter``) and only their reasons reach the driver. The
    dead-letter topic gets all of them (counted by its end offsets) and the job goes on
    evaluating the collector's telemetry."""
    from bench.load import Fleet, as_version

    cluster = kafka_cluster
    cluster.create_topic(unique_name("ahead-watched"), partitions=2, replication_factor=3)
    fleet, ahead = Fleet(100_000, cluster="ahead"), int(time.time() * 1000) + 3_600_000
    records = [(None, as_version(r, 3)) for i in range(10) for r in fleet.round(i, ahead + i * 20_000)]
    with Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(4)
        pipe.job.stop()  # a clean stop; the records are then a backlog the next start reads at once
        before = sum(end_offsets(cluster, pipe.deadletter_topic).values())
        produce(cluster, pipe.telemetry_topic, records, 2)
        pipe.start_job()

        def letters() -> int:
            return sum(end_offsets(cluster, pipe.deadletter_topic).values()) - before

        until("a dead letter for every observation", every(10, lambda: letters() >= 1_000_000), 600, pipe)
        seen = len(pipe.batches())
        until("the job to go on evaluating", lambda: len(pipe.batches()) > seen + 2, 120, pipe)
        assert "OutOfMemoryError" not in pipe.job_log()
        # counted once each by reason (a retried task may write one twice: the topic has at least as many)
        assert (
            sum(int(n) for n in re.findall(r"deadletters batch_id=\S+ .*?future_t=(\d+)", pipe.job_log())) == 1_000_000
        )
        assert pipe.batches()[-1][1] > 0, "the collector's telemetry is still read"
