"""Poison telemetry (issue 14): any byte sequence on the telemetry topic is
dead-lettered with a reason and its bytes kept, and never fails a batch.

Real Spark (local mode), the job's own parse, side and aggregation code on an
in-memory batch (so values may hold newlines, which the spool cannot), and
the dead-letter file sink. The regression on the real Kafka cluster is
tests/e2e/test_poison_records.py.
"""

from __future__ import annotations

import hashlib
import json
import random
import time

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from isrwatch.rule import Rule
from isrwatch.telemetry import Observation, TelemetryRecord, encode_record
from streaming.evaluation import parse, state
from streaming.sinks.outputs import DeadLetterFile, payload_bytes
from streaming.sources.source_spool import RAW_SCHEMA
from tests.streaming.rare import rare_rows

pytestmark = pytest.mark.spark

RAW = RAW_SCHEMA  # the source's columns, as the job's own sources give them
FUTURE_TOLERANCE_MS = 300_000  # the job's, in Kafka mode
NOW = int(time.time() * 1000)


def good_record(partition: int, cluster: str = "poison") -> bytes:
    o = Observation("orders", partition, 2, 1, NOW, 100 + partition, 100 + partition, prev_t_ms=NOW - 1000)
    return encode_record(TelemetryRecord(cluster, "test", NOW, (o,)))


GOOD = good_record(0)
_rng = random.Random(14)
MB_RANDOM = _rng.randbytes(1 << 20)
NESTED = b"[" * 10_000 + b"]" * 10_000

# value -> the reason the job must give
FIXED: list[tuple[bytes | None, str]] = [
    (b"\xff\xfe", "not_utf8"),
    (b"", "empty_value"),
    (None, "empty_value"),
    (b"\xed\xa0\x80", "not_utf8"),  # a lone surrogate, UTF-8 encoded (CESU-8)
    ("x\udc80y".encode("utf-8", "surrogatepass"), "not_utf8"),
    (b"\xc0\x80", "not_utf8"),  # an overlong NUL
    (b"\xf4\x90\x80\x80", "not_utf8"),  # above U+10FFFF
    (GOOD[: len(GOOD) // 2], "not_json"),  # truncated
    (GOOD.replace(b'"poison"', b'"poi\xffson"'), "not_utf8"),  # JSON whose text is not UTF-8
    (GOOD.decode().encode("utf-16"), "not_utf8"),
    (b"\xef\xbb\xbf" + GOOD, "not_json"),  # a byte-order mark
    (MB_RANDOM, "not_utf8"),
    (b"\n" * (1 << 20), "not_json"),
    (GOOD[:-1] + b', "pad": "' + b"a" * (1 << 20) + b'"}', ""),  # 1 MB and good: accepted
    (NESTED, "not_json"),
    (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "not_json"),
    (GOOD[:-1] + b', "x": ' + NESTED + b"}", "not_json"),  # a good record, nested too deep
    (b"\x00", "not_json"),
    (b"null", "not_object"),
    (b'"\\ud800"', "not_object"),
]


def _side_and_aggregates(spark, rows):
    """The batch's rare rows as the job gets them, the aggregation of the batch (as the driver
    gets both: Arrow to Python) and the offsets whose observations were read."""
    batch = spark.createDataFrame(rows, RAW)
    out = rare_rows(batch, FUTURE_TOLERANCE_MS)
    obs = parse.observations(parse.parse_records(batch), FUTURE_TOLERANCE_MS)
    aggs = state.replica_aggregates(parse.good_observations(obs), Rule.KIP16_REFINED).toArrow().to_pylist()
    read = {r["source_offset"] for r in obs.where("reason is null").select("source_offset").distinct().collect()}
    return out, aggs, read


def _by_offset(letters):
    by: dict[int, list[dict]] = {}
    for d in letters:
        assert set(d) == set(parse.DEADLETTER_COLUMNS)
        assert d["reason"] in parse.REASONS, d["reason"]
        by.setdefault(d["source_offset"], []).append(d)
    return by


def test_each_kind_of_poison_is_one_dead_letter_that_keeps_its_bytes(spark, tmp_path) -> None:
    rows = []
    for i, (value, _) in enumerate(FIXED):
        key = _rng.randbytes(i * 3) if i % 3 else None  # binary keys and null keys: never read
        rows.append((key, value, "telemetry", i % 4, i, None))
    good = {1000 + p: good_record(p) for p in range(1, 5)}
    rows += [(b"\xff\x00" * p, v, "telemetry", 0, off, None) for p, (off, v) in enumerate(good.items())]

    out, aggs, _ = _side_and_aggregates(spark, rows)

    by = _by_offset(out["deadletters"])
    got = {off: [d["reason"] for d in letters] for off, letters in by.items()}
    want = {i: [reason] for i, (_, reason) in enumerate(FIXED) if reason}
    assert got == want
    for i, (value, _) in enumerate(FIXED):
        for d in by.get(i, []):
            if (
                value is not None and len(value) > parse.PAYLOAD_KEPT_BYTES
            ):  # its first bytes, the whole's size and hash
                assert payload_bytes(d) == value[: parse.PAYLOAD_KEPT_BYTES], f"record {i}: the dead letter lost bytes"
                assert d["payload_bytes"] == len(value) and d["payload_sha256"] == hashlib.sha256(value).hexdigest()
                assert d["payload_encoding"] == "base64"
                continue
            assert payload_bytes(d) == value, f"record {i}: the dead letter lost bytes"
            assert d["payload_bytes"] is None and d["payload_sha256"] is None
            assert d["payload_encoding"] == (None if value is None else "utf8" if _is_utf8(value) else "base64")
            assert d["source_partition"] == i % 4 and d["source_topic"] == "telemetry"
    # The good records (and the good 1 MB one) still aggregate, one replica each.
    replicas = {(a["cluster"], a["topic"], a["partition"], a["broker_id"]): a["observations"] for a in aggs}
    assert replicas == {("poison", "orders", p, 2): 1 for p in range(0, 5)}

    # Through the job's dead-letter file: one JSON line each, the bytes back (the first
    # PAYLOAD_KEPT_BYTES of a bigger record, with the whole's size and hash).
    sink = DeadLetterFile(str(tmp_path / "deadletter.jsonl"))
    assert sink.write(out["deadletters"]) == len(want)
    sink.close()
    assert sink.failed == 0
    lines = (tmp_path / "deadletter.jsonl").read_bytes().splitlines()
    assert len(lines) == len(want)
    for line in lines:
        d = json.loads(line)
        value = FIXED[d["source_offset"]][0]
        assert payload_bytes(d) == (value[: parse.PAYLOAD_KEPT_BYTES] if value is not None else None)
        if d.get("payload_truncated"):
            assert value is not None and d["payload_sha256"] == hashlib.sha256(value).hexdigest()


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _insert(p: tuple[int, bytes]) -> bytes:
    return GOOD[: p[0]] + p[1] + GOOD[p[0] :]


def _replace(p: tuple[int, int]) -> bytes:
    return GOOD[: p[0]] + bytes([p[1]]) + GOOD[p[0] + 1 :]


VALUES = st.one_of(
    st.none(),
    st.binary(max_size=300),
    st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")),  # lone surrogates included
    st.text(max_size=60).map(lambda t: t.encode("utf-16", "surrogatepass")),
    st.integers(0, len(GOOD)).map(lambda n: GOOD[:n]),  # truncated
    st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)).map(_replace),  # one byte changed
    st.tuples(st.integers(0, len(GOOD)), st.binary(min_size=1, max_size=8)).map(_insert),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),  # nested, past the parser's 1,000 levels too
)
KEYS = st.one_of(st.none(), st.binary(max_size=40))


@seed(14)
@settings(
    max_examples=3,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(st.lists(st.tuples(KEYS, VALUES), min_size=150, max_size=300))
def test_fuzzed_records_are_dead_lettered_or_read_never_a_failed_batch(spark, records) -> None:
    good = {10_000 + p: good_record(p, cluster="fuzz-good") for p in range(3)}
    rows = [(k, v, "telemetry", i % 3, i, None) for i, (k, v) in enumerate(records)]
    rows += [(None, v, "telemetry", 0, off, None) for off, v in good.items()]

    out, aggs, read = _side_and_aggregates(spark, rows)  # raised here before the fix (UnicodeDecodeError)

    by = _by_offset(out["deadletters"])
    assert {(a["cluster"], a["partition"]) for a in aggs if a["cluster"] == "fuzz-good"} == {
        ("fuzz-good", p) for p in range(3)
    }
    for i, (_, value) in enumerate(records):
        letters = by.get(i, [])
        whole = [d for d in letters if d["reason"] in parse.RECORD_REASONS]
        if value is None or value == b"":
            assert [d["reason"] for d in letters] == ["empty_value"]
        elif not _is_utf8(value):
            assert [d["reason"] for d in letters] == ["not_utf8"]
        if whole:
            assert len(letters) == 1, letters
            assert payload_bytes(whole[0]) == value
            assert i not in read
        else:
            # Nothing dropped silently: a mutation that is still telemetry is read (or its bad parts rejected).
            assert letters or i in read, value
    for off in good:
        assert off not in by and off in read
