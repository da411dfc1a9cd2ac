"""StatusStore: updates, tombstones, expiry, snapshots under concurrent writes."""

from __future__ import annotations

import threading

from exporter.families import updated_at
from exporter.store import StatusStore
from isrwatch.status import State, status_key
from tests.exporter.samples import replica

T0 = 1_700_000_000_000


def keys(store: StatusStore) -> set[str]:
    return {status_key(s) for s in store.snapshot().statuses()}


def test_update_replaces_and_remove_forgets() -> None:
    store = StatusStore()
    a, b = replica(2), replica(3)
    store.update([a, b, replica(2, cluster="a/b", topic="x")])
    store.update([replica(2, State.NEARING, ratio=0.6)])
    snap = store.snapshot()
    assert len(snap) == 3
    assert snap.partitions[("prod", "orders", 0)].replicas[2].state is State.NEARING
    store.remove([status_key(a), "prod/orders/0/99", "a/b/x/0/2", "nope/orders/5/1"])
    assert keys(store) == {status_key(b)}
    store.remove([status_key(b)])
    assert store.snapshot().partitions == {}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_expiry_needs_both_the_cluster_clock_and_silence() -> None:
    clock = FakeClock()
    store = StatusStore(clock=clock)
    store.update([replica(2, topic="deleted", eval_ms=T0), replica(2, topic="live", eval_ms=T0)])
    store.update([replica(2, topic="frozen", eval_ms=T0)])
    store.update([replica(2, cluster="other", eval_ms=T0 - 3_600_000)])
    clock.now += 120
    assert store.expire(60_000) == []  # nothing newer seen: a stopped job expires nothing

    store.update([replica(2, topic="live", eval_ms=T0 + 120_000)])
    # Still reported, but frozen at its unreachable leader's last answer: stays.
    store.update([replica(2, topic="frozen", eval_ms=T0)])
    assert store.expire(60_000) == ["prod/deleted/0/2"]
    assert keys(store) == {"prod/live/0/2", "prod/frozen/0/2", "other/orders/0/2"}

    clock.now += 61
    store.update([replica(2, topic="live", eval_ms=T0 + 181_000)])
    assert store.expire(60_000) == ["prod/frozen/0/2"]  # now silent too


def test_the_last_update_time_is_the_receipt_aged_on_the_monotonic_clock() -> None:
    """``isrwatch_replica_last_update_timestamp_seconds``: the store keeps one monotonic
    time a replica and gives it back in Unix seconds, from the wall clock of its newest
    update. A wall clock stepped meanwhile (NTP) moves every timestamp with it at the next
    update, so their ages (``time() - value``) stay true."""
    mono, wall = FakeClock(), FakeClock()
    wall.now = 1_800_000_000.0
    store = StatusStore(clock=mono, wall_clock=wall)
    store.update([replica(2, eval_ms=T0), replica(3, eval_ms=T0)])
    mono.now += 5
    wall.now += 5
    store.update([replica(3, eval_ms=T0 + 5_000)])
    snap = store.snapshot()
    view = snap.partitions[("prod", "orders", 0)]
    assert (snap.received_at(view, 2), snap.received_at(view, 3)) == (wall.now - 5, wall.now)
    assert snap.received_at(view, 4) is None

    mono.now += 10
    wall.now += 10 + 3_600  # the wall clock stepped an hour ahead
    store.update([replica(2, topic="other", eval_ms=T0 + 15_000)])
    snap = store.snapshot()
    assert updated_at(snap, replica(2)) == wall.now - 15
    assert updated_at(snap, replica(3)) == wall.now - 10
    assert updated_at(snap, replica(2, topic="other")) == wall.now
    assert updated_at(snap, replica(2, topic="nope")) is None


def test_snapshot_is_consistent_while_writers_run() -> None:
    """Writers move a partition between two complete states; every snapshot
    sees one of them, never a mix."""
    store = StatusStore()
    healthy = [replica(b, eval_ms=T0) for b in (2, 3)]
    failing = [replica(b, State.STALLED, eval_ms=T0 + 1) for b in (2, 3)]
    store.update(healthy)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            store.update(failing)
            store.update(healthy)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        seen = set()
        for _ in range(2000):
            view = store.snapshot().partitions[("prod", "orders", 0)]
            states = frozenset(s.state for s in view.replicas.values())
            seen.add(states)
            assert len(states) == 1, states
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert seen <= {frozenset({State.OK}), frozenset({State.STALLED})}


def test_declared_deadletter_reasons_start_at_zero_and_keep_counts() -> None:
    store = StatusStore()
    store.health.record_batch(0.5, 10, {"not_json": 2})
    store.health.declare_deadletter_reasons(["not_json", "future_t"])
    assert store.snapshot().deadletters == {"not_json": 2, "future_t": 0}
    store.health.record_batch(0.5, 10, {"future_t": 1})
    assert store.snapshot().deadletters == {"not_json": 2, "future_t": 1}


def test_partition_counts_per_cluster_follow_updates_and_removals() -> None:
    store = StatusStore()
    store.update([replica(b, topic="x", partition=p) for p in range(3) for b in (2, 3)])
    store.update([replica(2, cluster="dr", topic="x")])
    assert store.snapshot().cluster_partitions == {"prod": 3, "dr": 1}
    store.remove(["prod/x/0/2"])  # the partition keeps follower 3
    assert store.snapshot().cluster_partitions == {"prod": 3, "dr": 1}
    store.remove(["prod/x/0/3", "dr/x/0/2", "dr/x/0/2"])
    snap = store.snapshot()
    assert snap.cluster_partitions == {"prod": 2}
    assert snap.cluster_partitions["prod"] == len(snap.partitions)


def test_two_clusters_numbering_their_brokers_alike_stay_apart() -> None:
    """Issue 52: the same topic, partition and broker ids in two clusters are two replicas."""
    store = StatusStore()
    store.update([replica(2, cluster="alpha"), replica(3, cluster="alpha")])
    store.update([replica(2, State.STALLED, cluster="beta", in_isr=True), replica(3, cluster="beta")])
    snap = store.snapshot()
    assert snap.partitions[("alpha", "orders", 0)].replicas[2].state is State.OK
    assert snap.partitions[("beta", "orders", 0)].replicas[2].state is State.STALLED
    store.remove(["beta/orders/0/2"])
    assert keys(store) == {"alpha/orders/0/2", "alpha/orders/0/3", "beta/orders/0/3"}
