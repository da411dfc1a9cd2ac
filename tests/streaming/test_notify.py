"""Unit tests of the sinks' own logic (no service)."""

from __future__ import annotations

import io
import json
from datetime import datetime

from isrwatch.alerts import Alert, AlertBook, AlertName, replica_alerts
from isrwatch.status import ReplicaStatus, State
from streaming.driver.notify import AlertmanagerSink, KafkaAlertsSink, StdoutSink, alert_event, alert_id
from tests.exporter.samples import replica


def status(state: State, eval_ms: int, ratio: float = 0.0, broker_id: int = 2) -> ReplicaStatus:
    return replica(broker_id, state, partition=3, eval_ms=eval_ms, ratio=ratio, offset_lag=7, lag_time_max_ms=10_000)


def test_stdout_sink_prints_one_json_line_per_started_and_resolved_alert() -> None:
    out = io.StringIO()
    sink = StdoutSink(out)
    book = AlertBook()
    sink.send(book.update(replica_alerts(status(State.CRITICAL, 10_000, 0.85)), 10_000), 10_000)
    sink.send(book.update(replica_alerts(status(State.CRITICAL, 11_000, 0.95)), 11_000), 11_000)  # holds: silent
    sink.send(book.update([], 12_000), 12_000)
    sink.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["labels"]["alertname"], e["status"]) for e in lines] == [
        ("KafkaReplicaNearingIsrShrink", "firing"),
        ("KafkaReplicaIsrShrinkImminent", "firing"),
        ("KafkaReplicaNearingIsrShrink", "resolved"),
        ("KafkaReplicaIsrShrinkImminent", "resolved"),
    ]
    assert "endsAt" not in lines[0]
    assert lines[2]["endsAt"] == "1970-01-01T00:00:12.000Z"
    # caught up at 1.5 s: 50% of the 10 s window at 6.5 s, 80% at 9.5 s
    assert lines[2]["startsAt"] == "1970-01-01T00:00:06.500Z"
    assert lines[3]["startsAt"] == "1970-01-01T00:00:09.500Z"
    assert lines[0]["labels"]["broker_id"] == "2" and lines[0]["labels"]["severity"] == "warning"


def test_alert_event_applies_grafana_and_runbook_links() -> None:
    alert = replica_alerts(status(State.STALLED, 5_000))[0]
    event = alert_event(alert, "firing", generator_url="http://grafana:3000/d/x", runbook_base="https://wiki/isr/")
    assert event["generatorURL"] == "http://grafana:3000/d/x"
    assert event["annotations"]["runbook_url"] == "https://wiki/isr#kafkareplicastalled"
    assert "runbook_url" not in alert_event(alert, "firing")["annotations"]  # no runbook: no link
    assert alert_id(alert) == (
        'KafkaReplicaStalled{broker_id="2",cluster="prod",leader_id="1",partition="3",topic="orders"}'
    )


class RecordingProducer:
    """Stands in for confluent_kafka.Producer: records what is produced."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        self.flushed = False

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.records.append((topic, key, value))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self.flushed = True
        return 0


def test_kafka_alerts_sink_writes_each_transition_keyed_by_alert_identity() -> None:
    producer = RecordingProducer()
    out = io.StringIO()
    sinks = [KafkaAlertsSink(producer, "isr.alerts"), StdoutSink(out)]  # as the monitor holds them
    book = AlertBook()
    for t, now in (
        (book.update(replica_alerts(status(State.STALLED, 1_000)), 1_000), 1_000),
        (book.update([], 2_000), 2_000),
    ):
        for sink in sinks:
            sink.send(t, now)
    for sink in sinks:
        sink.close()
    assert producer.flushed
    assert [(t, k.decode(), json.loads(v)["status"]) for t, k, v in producer.records] == [
        (
            "isr.alerts",
            'KafkaReplicaStalled{broker_id="2",cluster="prod",leader_id="1",partition="3",topic="orders"}',
            s,
        )
        for s in ("firing", "resolved")
    ]
    assert len(out.getvalue().splitlines()) == 2


def _parse(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def test_wire_times_never_run_ahead_of_the_wall_clock() -> None:
    """Telemetry time may be ahead of Alertmanager's clock (a fast simulator):
    startsAt is clamped to now and endsAt never precedes startsAt."""
    sink = AlertmanagerSink(["http://127.0.0.1:9"], resend_seconds=30, clock=lambda: 1_000.0)
    try:
        future = Alert(AlertName.STALLED, (("cluster", "c"),), "s", "d", starts_ms=2_000_000)
        firing = sink._wire(future, 1_000.0, 1_000.0 + 120)
        assert _parse(firing["startsAt"]) == 1_000.0
        assert _parse(firing["endsAt"]) == 1_120.0
        resolved = sink._wire(Alert(future.name, future.labels, "s", "d", 2_000_000, 2_500_000), 1_000.0, None)
        assert _parse(resolved["startsAt"]) == _parse(resolved["endsAt"]) == 1_000.0
        past = sink._wire(Alert(future.name, future.labels, "s", "d", 500_000, 600_000), 1_000.0, None)
        assert (_parse(past["startsAt"]), _parse(past["endsAt"])) == (500.0, 600.0)
    finally:
        sink.close(timeout_s=0.1)


def test_a_refire_cancels_a_pending_resolution() -> None:
    sink = AlertmanagerSink(["http://127.0.0.1:9"], backoff_initial_s=60, timeout_s=1)  # discard port: never answers
    try:
        book = AlertBook()
        alerts = replica_alerts(status(State.STALLED, 1_000))
        sink.send(book.update(alerts, 1_000), 1_000)
        sink.send(book.update([], 2_000), 2_000)
        assert list(sink.pending().values()) == [1] and sink.firing == []
        sink.send(book.update(replica_alerts(status(State.STALLED, 3_000)), 3_000), 3_000)
        assert list(sink.pending().values()) == [0]
        assert [a.name for a in sink.firing] == [AlertName.STALLED]
    finally:
        sink.close(timeout_s=0.1)


def test_held_alerts_unknown_to_a_new_sink_are_news() -> None:
    """After a job restart the book holds alerts the fresh sink never saw:
    they must count as undelivered, not wait for the next re-send."""
    book = AlertBook()
    book.update(replica_alerts(status(State.STALLED, 1_000)), 1_000)
    sink = AlertmanagerSink(["http://127.0.0.1:9"], backoff_initial_s=60, timeout_s=1)
    try:
        assert sink.flush(5)  # its first round: nothing to deliver yet
        holding = book.update(replica_alerts(status(State.STALLED, 2_000)), 2_000)
        assert holding.holding and not holding.started
        sink.send(holding, 2_000)
        assert not sink.flush(0.5)  # undelivered news (nothing listens on port 9)
        assert [a.name for a in sink.firing] == [AlertName.STALLED]
    finally:
        sink.close(timeout_s=0.1)
