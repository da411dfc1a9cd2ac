"""Alert choice, transitions and the Alertmanager v2 shape."""

from __future__ import annotations

import dataclasses

from isrwatch.alerts import AlertBook, AlertName, partition_alerts, replica_alerts, stale_alert
from isrwatch.rule import RuleConfig
from isrwatch.status import State, Thresholds, evaluate
from tests.isrwatch.test_status import T0, agg

CFG = RuleConfig(lag_time_max_ms=10_000)


def status(behind_ms: int, **kw: object):  # type: ignore[no-untyped-def]
    now = T0 + 20_000
    return evaluate(agg(last_caught_up_ms=now - behind_ms, leo=90, leader_leo=100, **kw), now, CFG, Thresholds())


def names(alerts) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.name.value for a in alerts]


def test_lag_alerts_are_cumulative_by_state() -> None:
    assert names(replica_alerts(status(1000))) == []
    assert names(replica_alerts(status(6000))) == ["KafkaReplicaNearingIsrShrink"]
    assert names(replica_alerts(status(9000))) == ["KafkaReplicaNearingIsrShrink", "KafkaReplicaIsrShrinkImminent"]
    assert names(replica_alerts(status(11000)))[-1] == "KafkaReplicaOutOfSync"


def test_lag_alerts_start_when_the_replica_crossed_not_when_a_batch_noticed() -> None:
    # Seen 11 s behind at once (a long batch, a restart): each alert starts when the
    # age since the last caught-up time reached its share of the 10 s window.
    s = status(11_000)
    lcu = s.eval_ms - 11_000
    starts = {a.name: a.starts_ms for a in replica_alerts(s)}
    assert starts == {
        AlertName.NEARING: lcu + 5_000,
        AlertName.IMMINENT: lcu + 8_000,
        AlertName.OUT_OF_SYNC: lcu + 10_000,
    }
    custom = replica_alerts(s, Thresholds(nearing_ratio=0.3, critical_ratio=0.6))
    assert [a.starts_ms - lcu for a in custom] == [3_000, 6_000, 10_000]


def test_out_of_the_isr_before_the_window_starts_when_seen() -> None:
    s = status(2_000, isr=(1,))  # the leader dropped it, though caught up 2 s ago
    assert s.state is State.OUT_OF_SYNC
    assert {a.starts_ms for a in replica_alerts(s)} == {s.eval_ms}


def test_alertmanager_object_has_the_contract_labels_and_annotations() -> None:
    a = replica_alerts(status(9000))[1]
    body = a.to_alertmanager("http://exporter:9743/runbook/")
    assert body["labels"] == {
        "alertname": "KafkaReplicaIsrShrinkImminent",
        "severity": "critical",
        "cluster": "c1",
        "topic": "orders",
        "partition": "3",
        "broker_id": "2",
        "leader_id": "1",
    }
    assert set(body["annotations"]) == {"summary", "description", "runbook_url"}
    assert body["annotations"]["runbook_url"] == "http://exporter:9743/runbook#kafkareplicaisrshrinkimminent"
    assert body["startsAt"].endswith("Z") and "endsAt" not in body


def test_without_a_runbook_an_alert_carries_no_runbook_link() -> None:
    a = replica_alerts(status(9000))[1]
    assert set(a.to_alertmanager()["annotations"]) == {"summary", "description"}
    assert set(a.to_alertmanager("")["annotations"]) == {"summary", "description"}


def test_book_starts_holds_and_resolves() -> None:
    book = AlertBook()
    t1 = book.update(replica_alerts(status(6000)), T0)
    assert names(t1.started) == ["KafkaReplicaNearingIsrShrink"] and not t1.resolved
    t2 = book.update(replica_alerts(status(9000)), T0 + 1000)
    assert names(t2.started) == ["KafkaReplicaIsrShrinkImminent"]
    assert names(t2.holding) == ["KafkaReplicaNearingIsrShrink"]
    assert t2.holding[0].starts_ms == t1.started[0].starts_ms
    t3 = book.update([], T0 + 30_000)
    assert sorted(names(t3.resolved)) == ["KafkaReplicaIsrShrinkImminent", "KafkaReplicaNearingIsrShrink"]
    assert all(a.ends_ms == T0 + 30_000 for a in t3.resolved)
    assert "endsAt" in t3.resolved[0].to_alertmanager()


def test_scope_keeps_other_alert_kinds() -> None:
    book = AlertBook()
    book.update([stale_alert("c1", T0, T0 + 30_000)], T0 + 30_000)
    t = book.update([], T0 + 31_000, scope={AlertName.NEARING.value})
    assert t.resolved == [] and len(book.active) == 1


def test_alerts_held_to_their_start_are_not_ended_by_older_evidence() -> None:
    """A restarted job's book: its alerts end only on evidence later than their start, and a
    stalled one only past the hold its name is given (the stall time)."""
    book = AlertBook()
    started = book.update(replica_alerts(status(6000)), T0).started
    stalled = dataclasses.replace(started[0], name=AlertName.STALLED)
    book.active[stalled.key] = stalled
    held = set(book.active)
    hold = {AlertName.STALLED.value: 3000}
    start = started[0].starts_ms  # (its crossing, before T0)
    assert book.update([], start, held_to_start=held, hold_ms=hold).resolved == []
    t = book.update([], start + 1000, held_to_start=held, hold_ms=hold)
    assert names(t.resolved) == ["KafkaReplicaNearingIsrShrink"]
    assert book.update([], start + 3000, held_to_start=held, hold_ms=hold).resolved == []
    assert names(book.update([], start + 3001, held_to_start=held, hold_ms=hold).resolved) == ["KafkaReplicaStalled"]
    # without the hold (a running job's book), older evidence ends an alert at its start
    fresh = AlertBook()
    fresh.update(replica_alerts(status(6000)), T0)
    assert names(fresh.update([], start - 500).resolved) == ["KafkaReplicaNearingIsrShrink"]


def test_book_survives_a_json_round_trip() -> None:
    book = AlertBook()
    book.update(replica_alerts(status(9000)), T0)
    again = AlertBook.from_json(book.to_json())
    assert again.active == book.active
    assert again.update(replica_alerts(status(9000)), T0 + 1).started == []


def test_min_isr_at_risk_when_predicted_isr_falls_below_min_isr() -> None:
    bad = [status(9000, broker_id=2), status(11000, broker_id=3)]
    assert names(partition_alerts(bad, default_min_isr=1)) == ["KafkaPartitionMinIsrAtRisk"]
    ok = [status(9000, broker_id=2), status(0, broker_id=3)]
    assert partition_alerts(ok, default_min_isr=1) == []
    assert all(s.state is not State.STALLED for s in ok)


def test_a_stalled_follower_gets_stalled_and_its_lag_alerts() -> None:
    from dataclasses import replace

    now = T0 + 20_000
    silent = agg(leo=None, known_leo=90, leader_leo=120, last_answer_ms=T0 + 14_000, last_caught_up_ms=T0 + 14_000)
    s = evaluate(silent, now, CFG, Thresholds())
    assert s.state is State.STALLED and s.lag_state is State.NEARING
    assert names(replica_alerts(s)) == ["KafkaReplicaNearingIsrShrink", "KafkaReplicaStalled"]
    # just paused: lag still small, only the stall shows
    fresh = evaluate(replace(silent, last_caught_up_ms=T0 + 16_000, last_answer_ms=T0 + 16_000), now, CFG, Thresholds())
    assert names(replica_alerts(fresh)) == ["KafkaReplicaStalled"]


def test_min_isr_at_risk_is_judged_per_cluster_when_two_clusters_number_their_brokers_alike() -> None:
    """Issue 52: one follower going in each of two clusters with the same topic, partition and
    broker ids is one going per partition, not two in one."""
    alpha = [status(11000, broker_id=2, cluster="alpha"), status(0, broker_id=3, cluster="alpha")]
    beta = [status(0, broker_id=2, cluster="beta"), status(11000, broker_id=3, cluster="beta")]
    assert partition_alerts(alpha + beta, default_min_isr=2) == []
    both = [status(11000, broker_id=2, cluster="beta"), status(11000, broker_id=3, cluster="beta")]
    [alert] = partition_alerts(alpha + both, default_min_isr=2)
    assert dict(alert.labels)["cluster"] == "beta"
