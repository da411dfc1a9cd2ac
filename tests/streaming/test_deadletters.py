"""Dead-letter sinks: the payload decodes back to the rejected bytes, a dead
letter too big for Kafka keeps a prefix with its size and hash, and a sink
that cannot write counts and logs instead of raising (issue 14).

Real parts, nothing started: a file, ``/dev/full`` for a full disk, and a
librdkafka producer with no broker behind its address."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localkafka import free_port
from streaming.sinks.outputs import DeadLetterFile, KafkaDeadLetters, encode_deadletter, payload_bytes


def letter(raw: bytes | None, **over) -> dict:
    """A record-level dead letter as ``streaming.evaluation.batch.evaluate_records`` makes it (encoded as Spark does)."""
    if raw is None:
        payload, encoding = None, None
    else:
        try:
            payload, encoding = raw.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            payload, encoding = base64.b64encode(raw).decode(), "base64"
    d = {
        "reason": "not_utf8",
        "detail": None,
        "cluster": None,
        "source_topic": "isr.telemetry",
        "source_partition": 2,
        "source_offset": 7,
        "payload": payload,
        "payload_encoding": encoding,
    }
    d.update(over)
    return d


@settings(max_examples=300, database=None)
@given(st.one_of(st.none(), st.binary(max_size=3000), st.text(max_size=1000).map(str.encode)), st.integers(600, 4000))
def test_the_payload_decodes_back_to_the_bytes_or_a_prefix_with_size_and_hash(raw, max_bytes) -> None:
    d = letter(raw)
    whole = json.loads(encode_deadletter(d))
    assert payload_bytes(whole) == raw

    out = encode_deadletter(d, max_bytes)
    assert len(out) <= max_bytes
    back = json.loads(out)
    if not back.get("payload_truncated"):
        assert payload_bytes(back) == raw
    else:
        assert raw is not None
        kept = payload_bytes(back)
        assert kept is not None and raw.startswith(kept)
        assert back["payload_bytes"] == len(raw)
        assert back["payload_sha256"] == hashlib.sha256(raw).hexdigest()
        assert len(kept) >= max_bytes // 2 - 400  # a prefix as long as fits, not a token one


def test_a_dead_letter_over_the_topic_limit_keeps_a_prefix() -> None:
    raw = os.urandom(1 << 20)  # base64 makes it 1.4 MB
    out = encode_deadletter(letter(raw), 900_000)
    back = json.loads(out)
    assert 899_000 < len(out) <= 900_000
    assert back["payload_truncated"] is True and back["payload_encoding"] == "base64"
    assert raw.startswith(payload_bytes(back) or b"!")


def test_a_full_disk_is_counted_not_raised(caplog) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    sink = DeadLetterFile("/dev/full")
    assert sink.write([letter(b"\xff" * 10), letter(b"abc")]) == 0
    assert sink.failed == 2
    assert "deadletters_lost" in caplog.text and "count=2" in caplog.text
    assert sink.write([letter(None)]) == 0
    assert sink.failed == 3
    sink.close()


def test_a_dead_letter_kafka_refuses_or_never_delivers_is_counted_not_raised(caplog) -> None:
    from confluent_kafka import Producer

    from streaming.sinks.producer import OutputProducer

    # As the job wires it; no broker behind the address.
    raw = Producer({"bootstrap.servers": f"127.0.0.1:{free_port()}", "message.timeout.ms": "1500", "log_level": "0"})
    producer = OutputProducer(raw)
    # A limit above librdkafka's message.max.bytes: the producer itself refuses the big one.
    sink = KafkaDeadLetters(producer, "isr.deadletter", max_bytes=4_000_000)
    assert sink.write([letter(os.urandom(1_500_000)), letter(b"small")]) == 1
    assert sink.failed == 1
    assert "deadletters_lost" in caplog.text and "MSG_SIZE_TOO_LARGE" in caplog.text
    # The small one was handed over, then never delivered: the output producer counts it.
    sink.close()
    assert producer.stats()["isr.deadletter"].failed == 1
    assert sink.failed == 1


def test_the_reasons_in_the_docs_are_the_reasons_in_the_code() -> None:
    import re
    from pathlib import Path

    from streaming.evaluation.parse import REASONS, RECORD_REASONS

    doc = Path(__file__).parents[2] / "docs" / "streaming.md"
    section = doc.read_text().split("## Parsing and validation", 1)[1].split("\n## ", 1)[0]
    table = section.split("| reason | rejected |", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert sorted(documented) == sorted(REASONS), (
        f"docs/streaming.md (Parsing and validation) lists {sorted(documented)}, "
        f"streaming/evaluation/parse.py REASONS has {sorted(REASONS)}"
    )
    assert len(documented) == len(set(documented)), "a reason is listed twice in docs/streaming.md"
    assert set(RECORD_REASONS) <= set(REASONS), "streaming/evaluation/parse.py: RECORD_REASONS not in REASONS"


def big_bad_records(spark, n: int, unit: int, partitions: int):
    """``n`` records as the Kafka source gives them, made inside Spark (this test process never
    holds them), none UTF-8: each value 0xff, then its six-digit offset repeated ``unit`` times."""
    import pyspark.sql.functions as F

    return spark.range(n, numPartitions=partitions).select(
        F.lit(None).cast("binary").alias("key"),
        F.concat(F.unhex(F.lit("FF")), F.repeat(F.lpad(F.col("id").cast("string"), 6, "0"), unit).cast("binary")).alias(
            "value"
        ),
        F.lit("isr.telemetry").alias("topic"),
        F.lit(0).alias("partition"),
        F.col("id").alias("offset"),
        F.current_timestamp().alias("timestamp"),
    )


def test_a_batch_of_big_bad_records_keeps_their_first_bytes_and_the_job_its_memory(spark) -> None:
    """400 records of 900,001 bytes, none of them UTF-8, in one batch (360 MB: the source's
    100,000 records a batch allow far more). The batch held them whole and carried their base64
    to the driver, and its 1 GiB JVM ran out of memory (found 2026-12-04 with 300 of them),
    on every restart again. Now each dead letter keeps the first ``PAYLOAD_KEPT_BYTES``, the
    whole size and its SHA-256, and the batch completes (``big_bad_records``)."""
    from streaming.evaluation.parse import PAYLOAD_KEPT_BYTES
    from tests.streaming.rare import rare_rows

    n, unit = 400, 150_000  # each value: 0xff, then its six-digit number repeated
    batch = big_bad_records(spark, n, unit, 4)
    letters = rare_rows(batch, None)["deadletters"]
    assert len(letters) == n
    for d in letters:
        whole = b"\xff" + f"{d['source_offset']:06d}".encode() * unit
        back = json.loads(encode_deadletter(d, 900_000))
        assert back["reason"] == "not_utf8" and back["payload_truncated"] is True
        assert payload_bytes(back) == whole[:PAYLOAD_KEPT_BYTES]
        assert back["payload_bytes"] == len(whole) and back["payload_sha256"] == hashlib.sha256(whole).hexdigest()


def test_a_batch_keeps_at_most_its_share_of_dead_letter_bytes_whatever_its_cap() -> None:
    """``payload_kept_bytes``: a batch of ``cap`` bad records keeps at most
    ``DEADLETTER_BATCH_BYTES`` of them (unless each is already down to the least kept), never
    more than ``PAYLOAD_KEPT_BYTES`` of one, and less of each as the cap grows."""
    from streaming.evaluation.parse import (
        DEADLETTER_BATCH_BYTES,
        PAYLOAD_KEPT_BYTES,
        PAYLOAD_MIN_KEPT_BYTES,
        payload_kept_bytes,
    )
    from streaming.settings import JobSettings

    caps = [1, 2, 100, 511, 512, 513, 1_000, JobSettings().max_records_per_trigger, 50_000, 100_000, 10**9]
    kept = [payload_kept_bytes(cap) for cap in caps]
    assert kept == sorted(kept, reverse=True)
    for cap, k in zip(caps, kept, strict=True):
        assert PAYLOAD_MIN_KEPT_BYTES <= k <= PAYLOAD_KEPT_BYTES
        assert k * cap <= DEADLETTER_BATCH_BYTES or k == PAYLOAD_MIN_KEPT_BYTES, cap
    assert payload_kept_bytes(1) == PAYLOAD_KEPT_BYTES and payload_kept_bytes(10**9) == PAYLOAD_MIN_KEPT_BYTES
    # the default cap's share is well under the most kept: the flood of docs/benchmarks.md ran at it
    assert payload_kept_bytes(JobSettings().max_records_per_trigger) * 2 < PAYLOAD_KEPT_BYTES


def test_the_job_keeps_its_caps_share_of_each_bad_record(spark) -> None:
    """What the job passes the batch (``payload_kept_bytes`` of its cap) is what each dead
    letter keeps: 40 records of 36,001 bytes, each whole at the most kept (64 KiB), are cut to the
    default cap's share, with the whole's size and hash."""
    from streaming.evaluation.parse import PAYLOAD_KEPT_BYTES, payload_kept_bytes
    from streaming.settings import JobSettings
    from tests.streaming.rare import rare_rows

    n, unit = 40, 6_000  # each value: 0xff, then its six-digit number repeated (36,001 bytes)
    batch = big_bad_records(spark, n, unit, 2)
    share = payload_kept_bytes(JobSettings().max_records_per_trigger)
    assert share < 6 * unit + 1 < PAYLOAD_KEPT_BYTES
    for kept, cut in ((PAYLOAD_KEPT_BYTES, False), (share, True)):
        letters = rare_rows(batch, None, kept)["deadletters"]
        assert len(letters) == n
        for d in letters:
            whole = b"\xff" + f"{d['source_offset']:06d}".encode() * unit
            back = json.loads(encode_deadletter(d, 900_000))
            assert back.get("payload_truncated", False) is cut, kept
            assert payload_bytes(back) == (whole[:share] if cut else whole)
            if cut:
                assert back["payload_bytes"] == len(whole)
                assert back["payload_sha256"] == hashlib.sha256(whole).hexdigest()


def test_a_bad_record_within_the_kept_bytes_keeps_them_all(spark) -> None:
    """At ``PAYLOAD_KEPT_BYTES`` exactly, the dead letter is the record, as text when it is UTF-8."""
    import pyspark.sql.functions as F

    from streaming.evaluation.parse import PAYLOAD_KEPT_BYTES
    from tests.streaming.rare import rare_rows

    batch = spark.range(1).select(
        F.lit(None).cast("binary").alias("key"),
        F.repeat(F.lit("x"), PAYLOAD_KEPT_BYTES).cast("binary").alias("value"),
        F.lit("isr.telemetry").alias("topic"),
        F.lit(0).alias("partition"),
        F.col("id").alias("offset"),
        F.current_timestamp().alias("timestamp"),
    )
    (d,) = rare_rows(batch, None)["deadletters"]
    back = json.loads(encode_deadletter(d, 900_000))
    assert back["payload"] == "x" * PAYLOAD_KEPT_BYTES and back["payload_encoding"] == "utf8"
    assert "payload_truncated" not in back and "payload_sha256" not in back
