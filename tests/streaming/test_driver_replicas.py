"""``--driver-replicas not-ok``: only the replicas the driver needs leave Spark.

With it the driver holds the replicas not ok, those changing state, those of partitions
without a spare in-sync replica and the lookahead's; an ok replica that stays ok never
becomes a Python object there, and the batch's counts and each cluster's clock come from
Spark. The alerts must be exactly those of the default (``all``): the job's own path
(``BatchHandler`` on raw telemetry, real Spark) runs the same batches both ways and the
transitions are compared, time for time. The monitor's part (letting go of ok replicas,
tombstones for gone ones it does not hold, the counts) has its own tests without Spark.
"""

from __future__ import annotations

import pytest

from exporter.families import MetricsView
from exporter.store import StatusStore
from isrwatch.rule import RuleConfig
from isrwatch.status import ReplicaStatus, State, Thresholds
from isrwatch.telemetry import Observation
from streaming.evaluation.batch import BatchTotals
from streaming.lifecycle.handler import BatchHandler

from .test_monitor import Clock, Collect, _monitor
from .test_refresh_lookahead import _raw, handler_on

LAG_MS = 10_000
T0 = 1_700_000_000_000


def _status(broker: int, state: State, *, t_ms: int = T0, partition: int = 0, isr_size: int = 3) -> ReplicaStatus:
    ratio = {State.OK: 0.1, State.NEARING: 0.6, State.CRITICAL: 0.9, State.OUT_OF_SYNC: 1.0}[state]
    return ReplicaStatus(
        cluster="c", topic="t", partition=partition, broker_id=broker, leader_id=1, eval_ms=t_ms, state=state,
        time_since_caught_up_s=ratio * 10, lag_ratio=ratio, time_to_shrink_s=10 - ratio * 10, offset_lag=5,
        in_isr=True, isr_size=isr_size, min_isr=2, lag_time_max_ms=LAG_MS,
        shrink_window_start_ms=t_ms + 1_000, shrink_window_end_ms=t_ms + 6_000,
    )  # fmt: skip


class Tombstones:
    """The state topic's tombstones the monitor sends (``KafkaStates.remove``)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def remove(self, keys) -> None:
        self.keys.extend(keys)


def test_the_monitor_lets_go_of_a_replica_back_to_ok_and_counts_from_spark(tmp_path) -> None:
    clock, sink = Clock(), Collect()
    m = _monitor(tmp_path, clock, sink, holds_ok=False)
    totals = BatchTotals(observations=120, replicas=40, clocks={"c": T0 + 500})
    report = m.apply_statuses(0, [(_status(2, State.CRITICAL), T0, 3, None)], [], (), totals)
    assert (report.observations, report.replicas, report.rows, report.statuses) == (120, 40, 1, 1)
    assert m.cluster_now == {"c": T0 + 500}, "the clock is Spark's newest telemetry time, not the rows'"
    assert {a.name.value for t in sink.transitions for a in t.started} >= {"KafkaReplicaIsrShrinkImminent"}
    back = _status(2, State.OK, t_ms=T0 + 1_000)
    report = m.apply_statuses(1, [(back, T0 + 1_000, 4, None)], [back], (), BatchTotals(40, 40, {"c": T0 + 1_000}))
    assert report.resolved, "its return to ok resolves its alerts"
    assert m.statuses == {} and report.statuses == 0, "then the driver lets go of it"
    assert len(m.store.snapshot()) == 0, "and /metrics no longer serves it"


def test_the_default_monitor_keeps_the_replica_back_to_ok(tmp_path) -> None:
    """The same batches with ``holds_ok`` (the default): the replica stays held (the test
    above is not passing for want of a replica to hold)."""
    m = _monitor(tmp_path, Clock(), Collect())
    m.apply_statuses(0, [(_status(2, State.CRITICAL), T0, 3, None)])
    back = _status(2, State.OK, t_ms=T0 + 1_000)
    m.apply_statuses(1, [(back, T0 + 1_000, 4, None)], [back])
    assert list(m.statuses) == [("c", "t", 0, 2)]


def test_an_ok_follower_without_a_spare_in_sync_replica_stays_held(tmp_path) -> None:
    """ISR 2 at min ISR 2: its partition's at-risk count needs it even while ok."""
    m = _monitor(tmp_path, Clock(), Collect(), holds_ok=False)
    m.apply_statuses(
        0, [(_status(2, State.OK, isr_size=2), T0, 1, None), (_status(3, State.OK, partition=1), T0, 1, None)]
    )
    assert list(m.statuses) == [("c", "t", 0, 2)]


def test_a_gone_replica_the_driver_does_not_hold_still_gets_its_tombstone(tmp_path) -> None:
    tombstones = Tombstones()
    m = _monitor(tmp_path, Clock(), Collect(), holds_ok=False, state_topic=tombstones)
    m.apply_statuses(0, [(_status(2, State.NEARING), T0, 1, None)], [], (), BatchTotals(9, 9, {"c": T0}))
    gone = [("c", "t", 7, 3, T0 + 100), ("c", "t", 0, 2, T0 + 100)]  # one not held (ok), one held
    m.apply_statuses(1, [], [], gone, BatchTotals(9, 9, {"c": T0 + 100}))
    assert sorted(tombstones.keys) == ["c/t/0/2", "c/t/7/3"]
    assert m.statuses == {}


def test_a_store_of_the_replicas_not_ok_counts_partitions_at_risk_only() -> None:
    """No healthy count from a store that holds only some replicas (it would count the held
    ones); the at-risk count for every cluster heard of, 0 where none is at risk."""
    store = StatusStore(every_replica=False)
    store.update([_status(2, State.CRITICAL)])
    store.set_telemetry_time("d", T0)
    counts = MetricsView(default_min_isr=2).partitions(store.snapshot()).counts
    assert counts == {("c", "at_risk"): 1, ("d", "at_risk"): 0}
    full = StatusStore()
    full.update([_status(2, State.CRITICAL), _status(3, State.OK, partition=1)])
    assert MetricsView(default_min_isr=2).partitions(full.snapshot()).counts == {
        ("c", "at_risk"): 1,
        ("c", "healthy"): 1,
    }


# -- the job's path, on Spark ----------------------------------------------------------

FOLLOWERS = 24  # partitions 0..11, followers 2 and 3 of each
BATCHES = 12


def _obs(partition: int, broker: int, t_ms: int, leo: int, leader_leo: int, isr: tuple[int, ...]) -> Observation:
    return Observation(
        "orders", partition, broker, 1, t_ms, leo, leader_leo, hw=min(leo, leader_leo),
        isr=isr, replicas=(1, 2, 3), lag_time_max_ms=LAG_MS, min_isr=2,
    )  # fmt: skip


def _batch(b: int) -> list[Observation]:
    """Batch ``b``'s observations, one round a second: every follower caught up, but
    partition 0's follower 2, which stops fetching from batch 2 and catches up at batch 10
    (nearing, critical, out of sync on the way), partition 1's follower 3, whose partition
    has left it out of the ISR (out of sync until batch 5, then back), and partition 2,
    whose ISR is at min ISR (no spare) throughout."""
    out = []
    for s in range(2):
        t = T0 + b * 2_000 + s * 1_000
        leader_leo = 1_000 * (b * 2 + s + 1)
        for p in range(FOLLOWERS // 2):
            for broker in (2, 3):
                isr: tuple[int, ...] = (1, 2, 3)
                leo = leader_leo
                if (p, broker) == (0, 2) and 2 <= b < 10:
                    leo = 4_000
                if p == 1 and b < 5:
                    isr = (1, 2)
                    leo = leader_leo - 500 if broker == 3 else leo
                if p == 2:
                    isr = (1, 2)
                out.append(_obs(p, broker, t, leo, leader_leo, isr))
    return out


def _handler(spark, tmp_path, hold_ok: bool) -> BatchHandler:
    monitor = _monitor(tmp_path / "ck", Clock(), Collect(), holds_ok=hold_ok)
    monitor.store.every_replica = hold_ok
    return handler_on(spark, tmp_path, monitor, refresh_batches=1, hold_ok=hold_ok, default_min_isr=2)


def _said(sink: Collect) -> list[tuple[str, str, int, int | None, str]]:
    """Every alert transition sent, in order: (started or resolved, alert, time, replica)."""
    out = []
    for t in sink.transitions:
        for kind, alerts in (("started", t.started), ("resolved", t.resolved)):
            for a in alerts:
                labels = dict(a.labels)
                where = f"{labels.get('partition')}/{labels.get('broker_id', '-')}"
                out.append((kind, a.name.value, a.starts_ms, a.ends_ms, where))
    return out


@pytest.mark.spark
def test_not_ok_gives_the_default_s_alerts_and_holds_only_what_it_needs(spark, tmp_path, monkeypatch) -> None:
    # The held keys go to Spark as a literal set up to KEYS_INLINE (256) and as a broadcast
    # table beyond: at 2 this run takes both ways (2 to 4 replicas held), as an incident's
    # thousands of held replicas take the second.
    from streaming.evaluation import evaluate

    monkeypatch.setattr(evaluate, "KEYS_INLINE", 2)
    default, not_ok = _handler(spark, tmp_path / "all", True), _handler(spark, tmp_path / "not-ok", False)
    held_after: list[set[tuple[int, int]]] = []
    for b in range(BATCHES):
        for handler in (default, not_ok):
            handler(_raw(spark, b, _batch(b)), b)
        assert not_ok.monitor.cluster_now == default.monitor.cluster_now, b
        held_after.append({(k[2], k[3]) for k in not_ok.monitor.statuses})
        # every replica the default holds as not ok, the other holds too, with the same status
        for key, s in default.monitor.statuses.items():
            if s.state is not State.OK:
                assert not_ok.monitor.statuses[key] == s, (b, key)
    said = _said(default.monitor.sinks[0])
    assert said == _said(not_ok.monitor.sinks[0])
    names = {(kind, name, where) for kind, name, _, _, where in said}
    assert {("started", "KafkaReplicaOutOfSync", "0/2"), ("resolved", "KafkaReplicaOutOfSync", "0/2")} <= names
    assert ("resolved", "KafkaReplicaOutOfSync", "1/3") in names
    assert len(default.monitor.statuses) == FOLLOWERS
    # After the last batch: the two followers of partition 2 (no spare in-sync replica) only.
    assert held_after[-1] == {(2, 2), (2, 3)}
    assert (0, 2) in held_after[8] and (1, 3) in held_after[3], held_after
    # Both counted every observation (the store's health: Spark's totals against the driver's rows).
    assert not_ok.store.snapshot().observations == default.store.snapshot().observations == BATCHES * 2 * FOLLOWERS
    # A restart restores what the driver held, and each cluster's newest row (its clock).
    from streaming.lifecycle import query

    checkpoint = tmp_path / "not-ok" / "state"
    (checkpoint / query.AGG_DIR / "commits").mkdir(parents=True)
    (checkpoint / query.AGG_DIR / "commits" / "17").write_text("v1\n")
    cfg, th = RuleConfig(lag_time_max_ms=LAG_MS), Thresholds()
    restored = query.restore_statuses(spark, str(checkpoint), cfg, th, held=(2, None))
    got = {(s.partition, s.broker_id): last_t for s, last_t, _, _ in restored}
    assert held_after[-1] <= set(got), got
    extra = set(got) - held_after[-1]
    assert len(extra) <= 1, extra  # the cluster's newest row, for its clock
    assert max(got.values()) == default.monitor.cluster_now["c"]
    assert len(query.restore_statuses(spark, str(checkpoint), cfg, th)) == FOLLOWERS
    # A broker the job sees silent: its ok in-sync followers read back (Monitor.followers_of).
    # Broker 3: every partition's but partition 2's (out of that ISR throughout).
    on_3 = query.follower_statuses(spark, str(checkpoint), cfg, th, {("c", 3)})
    assert sorted((s.partition, s.broker_id) for s, _, _, _ in on_3) == [(p, 3) for p in range(12) if p != 2]
    assert all(s.state is State.OK and s.in_isr and s.eval_ms == last_t for s, last_t, _, _ in on_3)
    assert len(query.follower_statuses(spark, str(checkpoint), cfg, th, {("c", 2), ("c", 3)})) == FOLLOWERS - 1
    assert query.follower_statuses(spark, str(checkpoint), cfg, th, {("other", 3), ("c", 4)}) == []


class _Records:
    """Stands in for the state topic's writer (``streaming.sinks.statewriter.StateWriter``, tested
    on real Kafka in tests/streaming/test_statewriter.py): the replicas whose records a batch
    writes, as (partition, broker) pairs, one set per batch."""

    def __init__(self) -> None:
        self.batches: list[set[tuple[int, int]]] = []

    def write_statuses(self, rows, gone=()) -> tuple[str, int]:
        keys = {(r["partition"], r["broker_id"]) for r in rows.select("partition", "broker_id").collect()}
        self.batches.append(keys)
        return "driver", len(keys)


@pytest.mark.spark
def test_not_ok_with_a_refresh_period_writes_ok_replicas_records_at_their_refresh(spark, tmp_path) -> None:
    """``--driver-replicas not-ok --ok-refresh-batches N``: the driver takes what it takes
    without N; the state topic gets every replica at its first observation, every change and
    every replica not ok at every batch, and a replica that stays ok at every N-th of its
    observations (with N = 1, every replica every batch), so a fleet's state topic carries a
    N-th of the records of its ok replicas."""
    written: dict[int, _Records] = {}
    held_after: dict[int, list[set[tuple[int, int]]]] = {}
    for n in (1, 6):
        monitor = _monitor(tmp_path / f"ck{n}", Clock(), Collect(), holds_ok=False)
        monitor.store.every_replica = False
        records = written[n] = _Records()
        handler = handler_on(
            spark, tmp_path / str(n), monitor, refresh_batches=n, hold_ok=False, default_min_isr=2, states=records
        )
        held_after[n] = []
        for b in range(BATCHES):
            handler(_raw(spark, b, _batch(b)), b)
            held_after[n].append({(k[2], k[3]) for k in monitor.statuses})
    assert held_after[6] == held_after[1], "the driver holds the same replicas whatever N"
    everyone = {(p, b) for p in range(FOLLOWERS // 2) for b in (2, 3)}
    assert all(batch == everyone for batch in written[1].batches)
    refreshed = written[6].batches
    assert refreshed[0] == everyone, "every replica at its first observation"
    # what the driver holds after a batch (not ok, or no spare in-sync replica) is written in it
    for b in range(BATCHES):
        assert held_after[6][b] <= refreshed[b], b
    assert (0, 2) in held_after[6][8] and {(2, 2), (2, 3)} <= held_after[6][0], held_after[6]
    steady = {(p, b) for p, b in everyone if p >= 3}  # (partitions 0-2: a fault, or at min ISR)
    for key in steady:  # ok throughout: observed twice a batch, so refreshed every 3 batches
        times = [b for b in range(1, BATCHES) if key in refreshed[b]]
        assert 3 <= len(times) <= 4, (key, times)
    assert sum(len(batch) for batch in refreshed) < sum(len(batch) for batch in written[1].batches) / 2


POLL_MS = 3_500  # between a quarter and a half of LAG_MS: a follower that keeps up is this far behind


def _polled(r: int) -> list[Observation]:
    """Round ``r`` (every ``POLL_MS``) of a producing leader's partitions 0..3, followers 2 and 3:
    each follower has fetched up to the round before's leader LEO (kept up: caught up as of its
    previous observation, ``POLL_MS`` behind), but partition 0's follower 2, which stops fetching
    after round 3."""
    t, leader_leo = T0 + r * POLL_MS, 1_000 * (r + 1)
    out = []
    for p in range(4):
        for broker in (2, 3):
            leo = leader_leo if r == 0 else 1_000 * r
            if (p, broker) == (0, 2) and r > 3:
                leo = 3_000
            out.append(_obs(p, broker, t, leo, leader_leo, (1, 2, 3)))
    return out


@pytest.mark.spark
@pytest.mark.parametrize("hold_ok", [True, False], ids=["all", "not-ok"])
def test_followers_that_keep_up_at_a_sparse_poll_are_not_carried_to_nearing(spark, tmp_path, hold_ok) -> None:
    """A collector polling every 3.5 s at a 10 s lag time (its follower's crossing, lcu + 5 s,
    comes 1.5 s after each observation, before the next): a follower that keeps up is never
    carried to Nearing between batches, whichever way the driver holds replicas, in batches of
    one round and in a slow batch of three. Each row's observation before its newest comes from
    Spark (``evaluate.PREV_OBSERVED``): with ``not-ok`` the driver does not hold the ok followers
    it would otherwise have it from, nor does any driver know it in a batch of several rounds
    (both carried false Nearings before). The follower that stops is nearing from its telemetry."""
    from streaming.driver.lookahead import Lookahead

    cfg, th = RuleConfig(lag_time_max_ms=LAG_MS), Thresholds()
    clock, sink = Clock(), Collect()
    monitor = _monitor(tmp_path / "ck", clock, sink, holds_ok=hold_ok, lookahead=Lookahead(cfg, th, live_ms=15_000))
    monitor.store.every_replica = hold_ok
    handler = handler_on(spark, tmp_path, monitor, refresh_batches=1, hold_ok=hold_ok, default_min_isr=2)
    batches = [[0], [1], [2], [3], [4, 5, 6], [7]]
    for b, rounds in enumerate(batches):
        clock.t = (T0 + rounds[-1] * POLL_MS + 200) / 1000
        handler(_raw(spark, b, [o for r in rounds for o in _polled(r)]), b)
        for late_ms in (1_600, 3_000):  # past the crossings a follower's age alone would say
            clock.t = (T0 + rounds[-1] * POLL_MS + late_ms) / 1000
            monitor.carry_forward()
    started = {(name, where) for kind, name, _, _, where in _said(sink) if kind == "started"}
    assert {where for _, where in started} == {"0/2"}, started  # the stopped follower's alerts only
    assert ("KafkaReplicaNearingIsrShrink", "0/2") in started, started
