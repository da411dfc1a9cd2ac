"""``isrwatch doctor`` with default settings against a protocol-level fake of a Kafka 4.0
cluster (tests/support/fakebroker.py). A protocol check, not evidence about a broker's
behaviour: the doctor's Kafka rows (the cluster, each broker, isrwatch's topics) come from
requests sent in versions 4.0 accepts, and read. Real-broker evidence is Kafka 0.9's
(tests/doctor/test_doctor.py). The doctor runs as the user runs it, in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.fakebroker import FakeKafka, sample_topics

TOPICS = ("isr.telemetry", "isr.replica-state", "isr.alerts", "isr.deadletter")
ZERO_NINE = ["--kafka-config", "api.version.request=false", "--kafka-config", "broker.version.fallback=0.9.0.1"]


@pytest.mark.parametrize("flags", [[], ZERO_NINE], ids=["default-settings", "with-the-0.9-settings"])
def test_the_doctor_reads_the_4_0_protocol_fake(tmp_path, flags) -> None:
    topics = {**sample_topics(TOPICS, replication=1), **sample_topics(("orders",))}
    with FakeKafka(topics) as fake:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "isrwatch",
                "doctor",
                "--bootstrap-servers",
                fake.bootstrap,
                "--checkpoint-dir",
                str(tmp_path / "checkpoint"),
                "--format",
                "json",
                "--timeout-seconds",
                "10",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        asked = {(n, v) for _, n, v in fake.asked}
        refused, unmodelled = list(fake.refused), list(fake.unmodelled)
    assert "Traceback" not in done.stderr, done.stderr
    rows = {r["check"]: r for r in json.loads(done.stdout)["checks"]}
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
    # with the 0.9 settings, only the start-up check (ListOffsets v0 for no partition) is refused
    assert {(n, v) for _, n, v in refused} == ({("ListOffsets", 0)} if flags else set())
    assert unmodelled == []
    assert {v for n, v in asked if n == "ListOffsets"} == {5}
    assert ("Metadata", 7) in asked
