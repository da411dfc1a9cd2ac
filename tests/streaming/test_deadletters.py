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
from streaming.outputs import DeadLetterFile, KafkaDeadLetters, encode_deadletter, payload_bytes


def letter(raw: bytes | None, **over) -> dict:
    """A record-level dead letter as ``streaming.batch.evaluate_records`` makes it (encoded as Spark does)."""
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

    from streaming.producer import OutputProducer

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

    from streaming.parse import REASONS, RECORD_REASONS

    doc = Path(__file__).parents[2] / "docs" / "streaming.md"
    section = doc.read_text().split("## Parsing and validation", 1)[1].split("\n## ", 1)[0]
    table = section.split("| reason | rejected |", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert sorted(documented) == sorted(REASONS), (
        f"docs/streaming.md (Parsing and validation) lists {sorted(documented)}, "
        f"streaming/parse.py REASONS has {sorted(REASONS)}"
    )
    assert len(documented) == len(set(documented)), "a reason is listed twice in docs/streaming.md"
    assert set(RECORD_REASONS) <= set(REASONS), "streaming/parse.py: RECORD_REASONS not in REASONS"
