"""The custom collector read through a fresh registry, metric by metric."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporter.families import StoreCollector
from exporter.store import StatusStore
from isrwatch.status import State
from tests.exporter.samples import replica, shorter_lag_evidence

T0 = 1_700_000_000_000


def registry(store: StatusStore, **options: object) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, **options))  # type: ignore[arg-type]
    return reg


def r_labels(broker_id: int, partition: int = 0, topic: str = "orders", leader_id: int = 1) -> dict[str, str]:
    return {
        "cluster": "prod",
        "topic": topic,
        "partition": str(partition),
        "broker_id": str(broker_id),
        "leader_id": str(leader_id),
    }


def p_labels(partition: int = 0, topic: str = "orders", leader_id: int = 1) -> dict[str, str]:
    return {"cluster": "prod", "topic": topic, "partition": str(partition), "leader_id": str(leader_id)}


@pytest.fixture
def store() -> StatusStore:
    s = StatusStore()
    s.update(
        [
            # orders-0: leader 1, followers 2 (critical) and 3 (stalled), min ISR 2
            replica(2, State.CRITICAL, ratio=0.85, offset_lag=420, eval_ms=T0),
            replica(3, State.STALLED, ratio=0.3, offset_lag=900, eval_ms=T0 - 500),
            # orders-1: leader 2, follower 1 ok, follower 3 already out of the ISR, min ISR from default
            replica(1, State.OK, partition=1, leader_id=2, isr_size=2, min_isr=None, eval_ms=T0),
            replica(3, State.OUT_OF_SYNC, partition=1, leader_id=2, ratio=1.4, in_isr=False, isr_size=2, min_isr=None),
        ]
    )
    return s


def test_replica_gauges(store: StatusStore) -> None:
    reg = registry(store)
    get = reg.get_sample_value
    assert get("isrwatch_replica_time_since_caught_up_seconds", r_labels(2)) == pytest.approx(25.5)
    assert get("isrwatch_replica_lag_ratio", r_labels(2)) == pytest.approx(0.85)
    assert get("isrwatch_replica_time_to_shrink_seconds", r_labels(2)) == pytest.approx(4.5)
    assert get("isrwatch_replica_offset_lag", r_labels(2)) == 420
    assert get("isrwatch_replica_offset_lag", r_labels(3)) == 900
    assert get("isrwatch_replica_lag_ratio", r_labels(3, partition=1, leader_id=2)) == pytest.approx(1.4)
    assert get("isrwatch_replica_time_to_shrink_seconds", r_labels(3, partition=1, leader_id=2)) == 0


@pytest.mark.parametrize(
    ("broker_id", "partition", "leader_id", "current"),
    [(2, 0, 1, "critical"), (3, 0, 1, "stalled"), (1, 1, 2, "ok"), (3, 1, 2, "out_of_sync")],
)
def test_replica_state_is_one_hot(store: StatusStore, broker_id: int, partition: int, leader_id: int, current: str):
    reg = registry(store)
    values = {
        state.value: reg.get_sample_value(
            "isrwatch_replica_state", {**r_labels(broker_id, partition, leader_id=leader_id), "state": state.value}
        )
        for state in State
    }
    assert values == {s.value: (1.0 if s.value == current else 0.0) for s in State}


def test_partition_gauges(store: StatusStore) -> None:
    reg = registry(store, default_min_isr=1)
    get = reg.get_sample_value
    # orders-0: ISR 3; the critical and the stalled follower are predicted to leave.
    assert get("isrwatch_partition_isr_size", p_labels(0)) == 3
    assert get("isrwatch_partition_predicted_isr_size", p_labels(0)) == 1
    assert get("isrwatch_partition_min_isr_headroom", p_labels(0)) == -1  # min ISR 2 from the status
    # orders-1: ISR 2 (3 is already out, so it does not count again), min ISR from the default.
    assert get("isrwatch_partition_isr_size", p_labels(1, leader_id=2)) == 2
    assert get("isrwatch_partition_predicted_isr_size", p_labels(1, leader_id=2)) == 2
    assert get("isrwatch_partition_min_isr_headroom", p_labels(1, leader_id=2)) == 1
    assert (
        registry(store, default_min_isr=2).get_sample_value(
            "isrwatch_partition_min_isr_headroom", p_labels(1, leader_id=2)
        )
        == 0
    )


def test_partition_labels_follow_the_newest_status(store: StatusStore) -> None:
    store.update([replica(2, State.OK, leader_id=3, isr_size=2, eval_ms=T0 + 1000)])
    reg = registry(store)
    assert reg.get_sample_value("isrwatch_partition_isr_size", p_labels(0, leader_id=3)) == 2
    assert reg.get_sample_value("isrwatch_partition_isr_size", p_labels(0, leader_id=1)) is None


def test_isr_changes_telemetry_time_and_up(store: StatusStore) -> None:
    store.add_isr_changes("prod", "orders", 0, "shrink")
    store.add_isr_changes("prod", "orders", 0, "shrink", n=2)
    store.add_isr_changes("prod", "orders", 0, "expand")
    store.set_telemetry_time("prod", T0 + 2500)
    store.set_telemetry_time("prod", T0)  # never goes back
    reg = registry(store)
    get = reg.get_sample_value
    base = {"cluster": "prod", "topic": "orders", "partition": "0"}
    assert get("isrwatch_isr_changes_total", {**base, "change": "shrink"}) == 3
    assert get("isrwatch_isr_changes_total", {**base, "change": "expand"}) == 1
    assert get("isrwatch_telemetry_last_timestamp_seconds", {"cluster": "prod"}) == pytest.approx(T0 / 1000 + 2.5)
    assert get("isrwatch_up") == 1
    store.health.set_up(False)
    assert get("isrwatch_up") == 0
    with pytest.raises(ValueError, match="shrink"):
        store.add_isr_changes("prod", "orders", 0, "grow")  # type: ignore[arg-type]


def test_isr_changes_derived_from_in_isr_flips() -> None:
    store = StatusStore(derive_isr_changes=True)
    store.update([replica(2, State.OK)])
    store.update([replica(2, State.OUT_OF_SYNC, in_isr=False, isr_size=2)])
    store.update([replica(2, State.OUT_OF_SYNC, in_isr=False, isr_size=2)])
    store.update([replica(2, State.OK)])
    reg = registry(store)
    base = {"cluster": "prod", "topic": "orders", "partition": "0"}
    assert reg.get_sample_value("isrwatch_isr_changes_total", {**base, "change": "shrink"}) == 1
    assert reg.get_sample_value("isrwatch_isr_changes_total", {**base, "change": "expand"}) == 1


def test_job_metrics_appear_with_the_first_batch(store: StatusStore) -> None:
    reg = registry(store)
    assert reg.get_sample_value("isrwatch_job_batches_total") is None
    store.health.record_batch(0.9, 1200, {})
    store.health.record_batch(1.25, 800, {"bad_json": 2, "unknown_version": 1})
    store.health.record_batch(0.5, 10, {"bad_json": 1})
    get = reg.get_sample_value
    assert get("isrwatch_job_batch_duration_seconds") == 0.5
    assert get("isrwatch_job_batches_total") == 3
    assert get("isrwatch_job_observations_total") == 2010
    assert get("isrwatch_deadletter_records_total", {"reason": "bad_json"}) == 3
    assert get("isrwatch_deadletter_records_total", {"reason": "unknown_version"}) == 1


def _replica_series(reg: CollectorRegistry) -> set[str]:
    return {
        s.labels["topic"] + "/" + s.labels["partition"] + "/" + s.labels["broker_id"]
        for m in reg.collect()
        if m.name == "isrwatch_replica_lag_ratio"
        for s in m.samples
    }


def test_cardinality_control_keeps_partition_aggregates_complete() -> None:
    store = StatusStore()
    fleet = [replica(b, topic=f"t{i}", partition=p) for i in range(50) for p in range(4) for b in (2, 3)]
    hot = [
        replica(2, State.NEARING, topic="t7", partition=1, ratio=0.6),
        replica(3, State.CRITICAL, topic="t9", partition=0, ratio=0.9),
        replica(2, State.STALLED, topic="t9", partition=3, ratio=0.2),
    ]
    store.update(fleet + hot)
    assert len(_replica_series(registry(store))) == 400

    not_ok = registry(store, replica_series="not-ok")
    assert _replica_series(not_ok) == {"t7/1/2", "t9/0/3", "t9/3/2"}
    top = registry(store, replica_series="not-ok", replica_series_top=2)
    assert _replica_series(top) == {"t7/1/2", "t9/0/3"}
    assert _replica_series(registry(store, replica_series_top=1)) == {"t9/0/3"}

    # Aggregates still cover every partition.
    partitions = [s for m in top.collect() if m.name == "isrwatch_partition_predicted_isr_size" for s in m.samples]
    assert len(partitions) == 200
    assert top.get_sample_value("isrwatch_partition_predicted_isr_size", {**p_labels(0, "t9")}) == 2
    assert top.get_sample_value("isrwatch_partition_predicted_isr_size", {**p_labels(0, "t8")}) == 3


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="replica_series"):
        StoreCollector(StatusStore(), replica_series="some")
    with pytest.raises(ValueError, match="replica_series_top"):
        StoreCollector(StatusStore(), replica_series_top=-1)


def test_isr_membership_and_applied_threshold(store: StatusStore) -> None:
    get = registry(store).get_sample_value
    assert get("isrwatch_replica_in_isr", r_labels(2)) == 1
    assert get("isrwatch_replica_in_isr", r_labels(3, partition=1, leader_id=2)) == 0
    assert get("isrwatch_replica_lag_time_max_seconds", r_labels(2)) == pytest.approx(30.0)
    # The threshold is the ratio's denominator.
    since = get("isrwatch_replica_time_since_caught_up_seconds", r_labels(2))
    assert since / get("isrwatch_replica_lag_time_max_seconds", r_labels(2)) == pytest.approx(0.85)


def _partition_series(reg: CollectorRegistry, name: str = "isrwatch_partition_isr_size") -> set[str]:
    return {s.labels["topic"] + "/" + s.labels["partition"] for m in reg.collect() if m.name == name for s in m.samples}


def _counts(reg: CollectorRegistry) -> dict[str, float | None]:
    return {
        s: reg.get_sample_value("isrwatch_partitions", {"cluster": "prod", "state": s}) for s in ("at_risk", "healthy")
    }


def test_partition_series_at_risk_keeps_only_partitions_at_risk() -> None:
    store = StatusStore()
    # 30 healthy partitions: ISR 3 of 3 (leader 1, followers 2 and 3 ok), min ISR 2: headroom 1.
    store.update([replica(b, topic="calm", partition=p) for p in range(30) for b in (2, 3)])
    store.update(
        [
            # a follower not ok (nearing: not yet predicted to leave, headroom still 1)
            replica(2, State.NEARING, topic="hot", partition=0, ratio=0.6),
            replica(3, topic="hot", partition=0),
            # the ISR smaller than the replicas although both followers say ok (a stale status)
            replica(2, topic="hot", partition=1, isr_size=2),
            replica(3, topic="hot", partition=1, isr_size=2),
            # no spare in-sync replica: min ISR 3 of ISR 3
            replica(2, topic="hot", partition=2, min_isr=3),
            replica(3, topic="hot", partition=2, min_isr=3),
            # min ISR unknown: the exporter's default decides
            replica(2, topic="dflt", partition=0, min_isr=None),
            replica(3, topic="dflt", partition=0, min_isr=None),
        ]
    )
    everything = registry(store, default_min_isr=2)
    assert len(_partition_series(everything)) == 34
    at_risk = registry(store, default_min_isr=2, partition_series="at-risk")
    for name in ("isrwatch_partition_isr_size", "isrwatch_partition_predicted_isr_size"):
        assert _partition_series(at_risk, name) == {"hot/0", "hot/1", "hot/2"}
    assert at_risk.get_sample_value("isrwatch_partition_min_isr_headroom", p_labels(2, "hot")) == 0
    assert at_risk.get_sample_value("isrwatch_partition_min_isr_headroom", p_labels(0, "hot")) == 1
    assert at_risk.get_sample_value("isrwatch_partition_isr_size", p_labels(1, "hot")) == 2
    # the counts cover every partition, whichever partitions get series
    assert _counts(at_risk) == _counts(everything) == {"at_risk": 3, "healthy": 31}

    strict = registry(store, default_min_isr=3, partition_series="at-risk")
    assert _partition_series(strict) == {"hot/0", "hot/1", "hot/2", "dflt/0"}
    assert strict.get_sample_value("isrwatch_partition_min_isr_headroom", p_labels(0, "dflt")) == 0
    assert _counts(strict) == {"at_risk": 4, "healthy": 30}

    # recovery: the nearing follower is ok again, the partition is healthy and leaves
    store.update([replica(2, topic="hot", partition=0)])
    assert _partition_series(at_risk) == {"hot/1", "hot/2"}
    assert _counts(at_risk) == {"at_risk": 2, "healthy": 32}


def test_an_isr_change_keeps_the_partition_for_recent_change_s() -> None:
    now = [1000.0]
    store = StatusStore(derive_isr_changes=True, clock=lambda: now[0], recent_change_s=600)
    store.update([replica(b, topic="calm", partition=p) for p in range(10) for b in (2, 3)])
    store.update([replica(2, State.OUT_OF_SYNC, topic="calm", partition=4, in_isr=False, isr_size=2, ratio=1.2)])
    store.add_isr_changes("other", "t", 0, "shrink", n=5)
    reg = registry(store, partition_series="at-risk")
    changes = {"cluster": "prod", "topic": "calm", "partition": "4"}
    assert _partition_series(reg) == {"calm/4"}
    assert reg.get_sample_value("isrwatch_isr_changes_total", {**changes, "change": "shrink"}) == 1

    now[0] += 30
    store.update([replica(2, topic="calm", partition=4)])  # caught up, back in the ISR: healthy, expand counted
    assert _partition_series(reg) == {"calm/4"}
    assert reg.get_sample_value("isrwatch_isr_changes_total", {**changes, "change": "expand"}) == 1
    assert reg.get_sample_value("isrwatch_partition_isr_size", p_labels(4, "calm")) == 3
    assert _counts(reg) == {"at_risk": 1, "healthy": 9}
    assert _partition_series(reg, "isrwatch_isr_changes") == {"calm/4"}  # other/t/0 has no statuses: no series

    now[0] += 601
    assert _partition_series(reg) == set()
    assert _partition_series(reg, "isrwatch_isr_changes") == set()
    assert _counts(reg) == {"at_risk": 0, "healthy": 10}
    # the cluster counters keep every change, of every cluster
    get = reg.get_sample_value
    assert get("isrwatch_cluster_isr_changes_total", {"cluster": "prod", "change": "shrink"}) == 1
    assert get("isrwatch_cluster_isr_changes_total", {"cluster": "prod", "change": "expand"}) == 1
    assert get("isrwatch_cluster_isr_changes_total", {"cluster": "other", "change": "shrink"}) == 5
    # with partition_series=all the per-partition counters stay
    assert _partition_series(registry(store), "isrwatch_isr_changes") == {"calm/4", "t/0"}


def test_bad_partition_series_is_refused() -> None:
    with pytest.raises(ValueError, match="partition_series"):
        StoreCollector(StatusStore(), partition_series="some")


def test_lag_time_evidence_is_served_by_cluster_and_direction(store: StatusStore) -> None:
    shorter_lag_evidence(store)
    store.health.record_batch(1.0, 10, {})
    get = registry(store).get_sample_value
    assert get("isrwatch_lag_time_evidence_total", {"cluster": "prod", "direction": "shorter"}) == 1
    assert get("isrwatch_lag_time_evidence_total", {"cluster": "prod", "direction": "longer"}) == 0


def test_unreadable_state_records_are_the_exporters_counter_served_from_zero(store: StatusStore) -> None:
    reg = registry(store)
    assert reg.get_sample_value("isrwatch_state_records_unreadable_total") is None  # the job's store: not served
    store.health.count_unreadable(0)  # the exporter's state-topic consumer, at its start
    assert reg.get_sample_value("isrwatch_state_records_unreadable_total") == 0
    store.health.count_unreadable()
    store.health.count_unreadable()
    assert reg.get_sample_value("isrwatch_state_records_unreadable_total") == 2
