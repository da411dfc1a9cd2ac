"""``isrwatch doctor`` with default settings against a protocol-level fake of a Kafka 4.0
cluster (tests/support/fakebroker.py). A protocol check, not evidence about a broker's
behaviour: the doctor's Kafka rows (the cluster, each broker, isrwatch's topics) come from
requests sent in versions 4.0 accepts, and read. Real-broker evidence is Kafka 0.9's
(tests/doctor/test_doctor.py). The doctor runs as the user runs it, in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support.fakebroker import FakeKafka, sample_topics

TOPICS = ("isr.telemetry", "isr.replica-state", "isr.alerts", "isr.deadletter")
ZERO_NINE = ["--kafka-config", "api.version.request=false", "--kafka-config", "broker.version.fallback=0.9.0.1"]


@pytest.mark.parametrize("flags", [[], ZERO_NINE], ids=["default-settings", "with-the-0.9-settings"])
def test_the_doctor_reads_the_4_0_protocol_fake(tmp_path, flags) -> None:
    topics = {**sample_topics(TOPICS, replication=1), **sample_topics(("orders",))}
    with FakeKafka(topics) as fake:
        rows, done = _doctor(fake, tmp_path, *flags)
        asked = {(n, v) for _, n, v in fake.asked}
        refused, unmodelled = list(fake.refused), list(fake.unmodelled)
    assert rows["telemetry cluster"]["status"] == "ok", rows["telemetry cluster"]
    assert rows["telemetry cluster"]["found"].startswith("3 brokers, 5 topics")
    for b in fake.broker_ids:
        row = rows[f"broker {b} (telemetry cluster)"]
        assert row["status"] == "ok" and row["found"].startswith(fake.address(b)), row
    for topic in TOPICS:
        row = next(r for check, r in rows.items() if check.endswith(f" {topic}"))
        assert row["status"] == "ok" and row["found"].startswith("3 partitions, leaders 1,2,3"), row
    # the fake's telemetry topic is empty (high watermark 0, read with ListOffsets v5): nothing to read
    assert rows["newest telemetry"]["found"].startswith("no telemetry record"), rows["newest telemetry"]
    assert done.returncode == 1  # that one failed row
    # the fake brokers' own values (30,000 ms; min ISR 1, their default), read by DescribeConfigs
    # (the 0.9 settings too: each broker's versions come from its own ApiVersions answer)
    lag, min_isr = rows["replica.lag.time.max.ms"], rows["min.insync.replicas"]
    assert lag["status"] == "ok" and lag["found"].startswith("30000 ms on every broker"), lag
    assert min_isr["status"] == "ok" and min_isr["found"].startswith("1 for 5 topics"), min_isr
    # issue 55: the variant the job gives the cluster, from its brokers' ApiVersions answers (4.0's)
    rule = rows["rule variant"]
    assert rule["status"] == "ok", rule
    assert rule["found"].startswith(
        "kip16-refined, a follower at the leader's log end never out of sync (Kafka 4.0); "
        "the brokers answer ApiVersions as Kafka 4.0"
    ), rule
    # with the 0.9 settings, only the start-up check (ListOffsets v0 for no partition) is refused
    assert {(n, v) for _, n, v in refused} == ({("ListOffsets", 0)} if flags else set())
    assert unmodelled == []
    assert {v for n, v in asked if n == "ListOffsets"} == {5}
    assert ("DescribeConfigs", 2) in asked
    assert ("Metadata", 7) in asked


def _doctor(fake: FakeKafka, tmp_path, *flags: str) -> tuple[dict[str, dict[str, str]], Any]:
    """``isrwatch doctor`` run as a user runs it against ``fake``: its rows by check, and the process."""
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "doctor", "--bootstrap-servers", fake.bootstrap, "--checkpoint-dir",
         str(tmp_path / "checkpoint"), "--format", "json", "--timeout-seconds", "10", *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return {r["check"]: r for r in json.loads(done.stdout)["checks"]}, done


def test_the_doctor_shows_the_brokers_settings_and_where_they_differ(tmp_path) -> None:
    """Issue 55, item 3: the values the brokers give by DescribeConfigs, where each came from;
    brokers of one cluster with different lags are a warning; a broker that refuses is named."""
    topics = {**sample_topics(TOPICS, replication=1), **sample_topics(("orders", "payments"))}
    with FakeKafka(topics, lag_time_max_ms={1: 10_000, 2: 10_000, 3: 30_000}, min_isr={"orders": 2}) as fake:
        rows, _ = _doctor(fake, tmp_path)
    lag = rows["replica.lag.time.max.ms"]
    assert lag["status"] == "warn" and "broker 1: 10000, broker 2: 10000, broker 3: 30000" in lag["found"], lag
    min_isr = rows["min.insync.replicas"]
    assert min_isr["found"].startswith("1 for 5 topics") and "2 for 1 topic (orders)" in min_isr["found"], min_isr

    with FakeKafka(topics, lag_time_max_ms={1: 10_000, 2: 10_000}, describe_configs_refused={3}) as fake:
        rows, _ = _doctor(fake, tmp_path, "--lag-time-max-ms", "10000", "--rule", "kip16")
    rule = rows["rule variant"]  # a --rule given wins for every cluster: said, and that it is not the version's
    assert rule["status"] == "warn" and rule["found"].startswith("kip16 (given by --rule)"), rule
    assert "whose own variant is kip16-refined" in rule["found"] and "leave --rule out" in rule["fix"], rule
    lag = rows["replica.lag.time.max.ms"]
    assert lag["status"] == "warn" and lag["found"].startswith("10000 ms on every broker that answered"), lag
    assert "not read: broker 3" in lag["found"], lag
