"""The driver's per-batch logic without Spark: stale telemetry, replays after a restart."""

from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.store import StatusStore
from isrwatch.rule import RuleConfig
from isrwatch.status import State, Thresholds, status_key
from streaming.driver.checkpoint import DriverCheckpoint
from streaming.driver.monitor import Monitor


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Collect:
    def __init__(self) -> None:
        self.transitions = []

    def send(self, t, now_ms) -> None:
        self.transitions.append(t)


def _row(t_ms: int, caught_up_ms: int, n: int) -> dict:
    return {
        "cluster": "c", "topic": "t", "partition": 0, "broker_id": 2,
        "first_t_ms": 0, "last_t_ms": t_ms, "last_caught_up_ms": caught_up_ms,
        "last_answer_ms": t_ms, "last_leader_answer_ms": t_ms, "last_progress_ms": t_ms,
        "latest": {"leader_id": 1, "leo": 10, "leader_leo": 20, "hw": 10, "isr": [1, 2], "replicas": [1, 2],
                   "lag_time_max_ms": 10_000, "min_isr": 1},
        "known_leo": 10, "known_leader_leo": 20, "observations": n,
    }  # fmt: skip


def _apply(m: Monitor, batch_id: int, rows: list[dict]):
    """One batch of aggregate rows, each evaluated with the Python reference
    (``isrwatch.status.evaluate``) at its newest observation, into the monitor."""
    from isrwatch.status import evaluate
    from streaming.evaluation.state import row_to_aggregate

    items = []
    for row in rows:
        agg = row_to_aggregate(row)
        items.append((evaluate(agg, agg.last_t_ms, m.cfg, m.thresholds), agg.last_t_ms, int(row["observations"]), None))
    return m.apply_statuses(batch_id, items)


def _monitor(tmp_path, clock, sink, **extra) -> Monitor:
    """A monitor on a 10 s lag time; checkpointed under ``tmp_path`` unless it is None."""
    return Monitor(
        RuleConfig(lag_time_max_ms=10_000),
        Thresholds(),
        default_min_isr=1,
        stale_after_s=15,
        store=StatusStore(),
        sinks=[sink],
        checkpoint=DriverCheckpoint(tmp_path) if tmp_path is not None else None,
        wall_clock=clock,
        **extra,
    )


def test_stale_telemetry_raises_one_alert_and_freezes_ages(tmp_path) -> None:
    clock, sink = Clock(), Collect()
    m = _monitor(tmp_path, clock, sink)
    _apply(m, 0, [_row(100_000, 99_000, 5)])
    clock.t += 10
    assert not m.check_stale().started
    clock.t += 10  # 20 s without the cluster's clock moving
    t = m.check_stale()
    assert [a.name.value for a in t.started] == ["IsrwatchTelemetryStale"]
    assert not m.check_stale().started  # held, not re-raised
    # The replica's age did not move with the wall clock.
    assert m.statuses[("c", "t", 0, 2)].time_since_caught_up_s == 1.0
    _apply(m, 1, [_row(101_000, 100_500, 6)])
    assert [a.name.value for a in m.check_stale().resolved] == ["IsrwatchTelemetryStale"]
    clock.t += 20  # a second gap: a second episode, once
    assert [a.name.value for a in m.check_stale().started] == ["IsrwatchTelemetryStale"]
    assert not m.check_stale().started


def test_a_replayed_batch_announces_nothing_again(tmp_path) -> None:
    clock, sink = Clock(), Collect()
    m = _monitor(tmp_path, clock, sink)
    report = _apply(m, 0, [_row(100_000, 91_000, 5)])  # 9 s behind: nearing + imminent
    assert report.started == 2
    again = _monitor(tmp_path, clock, Collect())  # a restarted job, same checkpoint
    assert len(again.book.active) == 2 and again.handled_batch == 0
    replay = _apply(again, 0, [_row(100_000, 91_000, 5)])
    assert replay.skipped and replay.started == 0
    nxt = _apply(again, 1, [_row(102_000, 91_000, 7)])  # now out of sync: only the new one starts
    assert nxt.started == 1 and nxt.observations == 2


def test_a_batch_that_changes_no_alert_leaves_the_saved_book_and_a_restart_repeats_nothing(tmp_path) -> None:
    """The book is written when an alert starts or resolves, not at every batch (in an incident
    it holds thousands of alerts): a batch whose alerts hold leaves the file alone, and a job
    restarted after it, running that batch again, sends nothing new."""
    clock, sink = Clock(), Collect()
    m = _monitor(tmp_path, clock, sink)
    assert _apply(m, 0, [_row(100_000, 91_000, 5)]).started == 2  # nearing + imminent
    saved = m.checkpoint.alerts_path.read_bytes()
    held = _apply(m, 1, [_row(100_500, 91_000, 6)])  # the same two alerts hold
    assert held.started == held.resolved == 0
    assert m.checkpoint.alerts_path.read_bytes() == saved  # not written again
    again = _monitor(tmp_path, clock, Collect())  # a restarted job: batch 1 was not committed
    assert len(again.book.active) == 2 and again.handled_batch == 0
    replay = _apply(again, 1, [_row(100_500, 91_000, 6)])
    assert replay.started == replay.resolved == 0
    assert not any(t.started or t.resolved for t in again.sinks[0].transitions)
    resolved = _apply(again, 2, [_row(101_000, 101_000, 7)])  # caught up: both resolve, and the book is saved
    assert resolved.resolved == 2
    assert again.checkpoint.alerts_path.read_bytes() != saved


class Producer:
    """A confluent-kafka producer's surface, recording what is produced."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes | None]] = []

    def produce(self, topic, key=None, value=None) -> None:
        self.records.append((topic, key, value))

    def poll(self, timeout=0) -> int:
        return 0


def test_forgotten_replicas_reach_the_state_topic_as_tombstones(tmp_path) -> None:
    """The driver sends the state topic only the tombstones of replicas it forgets; the
    records of the statuses come from the executors (tests/streaming/test_statewriter.py)."""
    from streaming.sinks.outputs import KafkaStates

    producer = Producer()
    m = _monitor(None, Clock(), Collect(), state_topic=KafkaStates(producer, "isr.replica-state"))
    _apply(m, 0, [_row(100_000, 99_000, 5)])
    assert producer.records == []
    m.cluster_now["c"] = 100_000 + 20 * 60_000  # the cluster went on without this replica
    assert m.forget(15 * 60_000) == ["c/t/0/2"]
    assert producer.records[-1] == ("isr.replica-state", b"c/t/0/2", None)  # a tombstone


def test_the_state_table_forgets_at_the_monitor_s_cutoff() -> None:
    """``Monitor.forget_cutoffs``: per cluster, the telemetry time below which ``forget``
    drops a replica, what the job's state table leaves out (tests/streaming/test_state_table.py)."""
    m = _monitor(None, Clock(), Collect())
    assert m.forget_cutoffs(15 * 60_000) == {}  # no cluster clock yet (a job just started): nothing goes
    _apply(m, 0, [_row(100_000, 99_000, 5)])
    m.cluster_now["c"] = 100_000 + 15 * 60_000
    assert m.forget_cutoffs(15 * 60_000) == {"c": 100_000}
    assert m.forget(15 * 60_000) == []  # at the cutoff: kept, by both
    m.cluster_now["c"] += 1
    assert m.forget_cutoffs(15 * 60_000) == {"c": 100_001}
    assert m.forget(15 * 60_000) == ["c/t/0/2"]


def _any_row(cluster: str, partition: int, broker: int, t_ms: int, behind_ms: int, isr: list[int], answered: bool):
    row = _row(t_ms, t_ms - behind_ms, 1)
    row.update(cluster=cluster, partition=partition, broker_id=broker)
    row["latest"] = {**row["latest"], "isr": isr, "replicas": [1, 2, 3], "min_isr": 2, "leo": 10 if answered else None}
    return row


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["a", "b"]),
                st.integers(0, 2),
                st.sampled_from([2, 3]),
                st.integers(0, 15_000),
                st.sampled_from([[1, 2, 3], [1, 2], [1, 3], [1]]),
                st.booleans(),
            ),
            min_size=1,
            max_size=8,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_alerts_kept_per_replica_equal_alerts_from_every_status(batches) -> None:
    """The monitor updates alerts only for the batch's replicas and partitions;
    after every batch the book must hold what all statuses call for."""
    from isrwatch.alerts import partition_alerts, replica_alerts

    m = _monitor(None, Clock(), Collect())
    t = 100_000
    for batch_id, batch in enumerate(batches):
        t += 1000
        rows = {}
        for cluster, partition, broker, behind, isr, answered in batch:
            rows[(cluster, partition, broker)] = _any_row(cluster, partition, broker, t, behind, isr, answered)
        _apply(m, batch_id, list(rows.values()))
        everything = list(m.statuses.values())
        expected = [a for s in everything for a in replica_alerts(s)] + partition_alerts(everything, 1)
        assert set(m.book.active) == {a.key for a in expected}
        assert m.not_ok_keys() == {status_key(s) for s in everything if s.state is not State.OK}
        by_key = {a.key: a for a in expected}
        for key, alert in m.book.active.items():  # held alerts carry the current text
            assert (alert.summary, alert.description) == (by_key[key].summary, by_key[key].description)


def test_changes_inside_a_batch_fire_and_resolve_at_their_own_times(tmp_path) -> None:
    """An episode that began and ended inside one batch: its alerts are sent fired
    (at the crossing) and resolved (at the observation that showed the replica
    back), once; the batch's end state, ok, raises nothing more. A replay of the
    batch sends nothing."""
    from isrwatch.status import evaluate
    from streaming.evaluation.state import row_to_aggregate

    def status(t_ms: int, caught_up_ms: int):
        return evaluate(
            row_to_aggregate(_row(t_ms, caught_up_ms, 1)), t_ms, RuleConfig(lag_time_max_ms=10_000), Thresholds()
        )

    clock, sink = Clock(), Collect()
    m = _monitor(tmp_path, clock, sink)
    nearing = status(106_000, 100_000)  # 60 %: crossed 50 % at 105 000
    critical = status(108_500, 100_000)  # 85 %: crossed 80 % at 108 000
    back = status(109_000, 109_000)
    end = status(112_000, 111_500)
    report = m.apply_statuses(0, [(end, 112_000, 40, None)], [nearing, critical, back])
    assert (report.started, report.resolved) == (2, 2)
    events = [
        (a.name.value, "firing" if a in t.started else "resolved", a.starts_ms, a.ends_ms)
        for t in sink.transitions
        for a in (*t.started, *t.resolved)
    ]
    assert events == [
        ("KafkaReplicaNearingIsrShrink", "firing", 105_000, None),
        ("KafkaReplicaIsrShrinkImminent", "firing", 108_000, None),
        ("KafkaReplicaNearingIsrShrink", "resolved", 105_000, 109_000),
        ("KafkaReplicaIsrShrinkImminent", "resolved", 108_000, 109_000),
    ]
    assert not m.book.active and m.statuses[("c", "t", 0, 2)].state is State.OK
    again = _monitor(tmp_path, clock, Collect())  # restarted on the same checkpoint
    replay = again.apply_statuses(0, [(end, 112_000, 40, None)], [nearing, critical, back])
    assert replay.skipped and (replay.started, replay.resolved) == (0, 0)


def test_the_monitor_hands_the_last_catch_up_and_lag_to_the_shrink_outcomes() -> None:
    """A follower the job holds nearing, caught up at 99 s on a 10 s lag, dropped by its leader
    7 s after that (its own count rose): the brokers' lag is shorter than the job's."""
    m = _monitor(None, Clock(), Collect())
    m.outcomes.leader_count("c", 1, 99_000, 0)
    _apply(m, 0, [_row(100_000, 99_000, 5)])  # ok
    report = _apply(m, 1, [_row(104_500, 99_000, 6)])  # 5.5 s behind: nearing
    assert report.started == 1
    m.outcomes.leader_count("c", 1, 105_500, 1)
    m.outcomes.isr_change("c", "t", 0, 106_000, left=[2], leader=1)  # as streaming.lifecycle.handler does
    m.outcomes.settle({"c": 116_000})
    [found] = m.outcomes.take_evidence()
    assert (found.direction, found.replica, found.leader, found.lag_ms, found.behind_ms) == (
        "shorter",
        ("c", "t", 0, 2),
        1,
        10_000,
        7_000,
    )
    assert m.store.snapshot().outcomes["c"].evidence == {"shorter": 1, "longer": 0}


def test_a_replica_said_gone_is_forgotten_and_its_alerts_resolve_with_the_batch(tmp_path) -> None:
    """A deleted topic's replica (the collector's ``gone``): its alerts resolve with the
    batch that says so, not its forget time later; the exporter store and the state topic
    forget it; a gone said before the replica's newest telemetry does not drop it."""
    from streaming.sinks.outputs import KafkaStates

    clock, sink, producer = Clock(), Collect(), Producer()
    m = _monitor(tmp_path, clock, sink, state_topic=KafkaStates(producer, "isr.replica-state"))
    assert _apply(m, 0, [_row(100_000, 91_000, 5)]).started == 2  # 9 s behind: nearing + imminent
    key = ("c", "t", 0, 2)
    assert "c/t/0/2" in {status_key(s) for s in m.store.snapshot().statuses()}
    report = m.apply_statuses(1, [], gone=[(*key, 99_999)])  # said before its newest telemetry: kept
    assert report.resolved == 0 and key in m.statuses
    report = m.apply_statuses(2, [], gone=[(*key, 100_500), ("c", "other", 0, 3, 100_500)])
    assert report.resolved == 2 and not m.book.active
    assert {a.name.value for a in sink.transitions[-1].resolved} == {
        "KafkaReplicaNearingIsrShrink",
        "KafkaReplicaIsrShrinkImminent",
    }
    assert key not in m.statuses and not m.not_ok_keys()
    assert "c/t/0/2" not in {status_key(s) for s in m.store.snapshot().statuses()}
    assert producer.records[-1] == ("isr.replica-state", b"c/t/0/2", None)  # a tombstone
    # A record from before the gone, read after it (another telemetry partition, held up by a
    # broker's failure: the soak's run of 2026-12-01): ignored, named for the state table.
    report = _apply(m, 3, [_row(100_200, 91_000, 6)])
    assert report.late == [(*key, 100_500)] and key not in m.statuses and not m.book.active
    assert "c/t/0/2" not in {status_key(s) for s in m.store.snapshot().statuses()}
    m.forget(15 * 60_000)  # (within the forget time: still remembered)
    assert _apply(m, 4, [_row(100_300, 91_000, 6)]).late == [(*key, 100_500)]
    again = _monitor(tmp_path, clock, Collect())  # a restarted job: the book holds nothing of it
    assert not again.book.active
    # Telemetry after the gone (a topic created again): a follower again, held.
    report = _apply(m, 5, [_row(101_000, 101_000, 1)])
    assert not report.late and key in m.statuses


def _follower(row: dict, broker: int, leader: int, replicas: list[int]) -> dict:
    """``row`` as broker ``broker``'s, under ``leader``, of a partition on ``replicas``."""
    return {**row, "broker_id": broker, "latest": {**row["latest"], "leader_id": leader, "isr": replicas,
                                                   "replicas": replicas}}  # fmt: skip


def test_a_follower_elected_leader_is_forgotten_and_its_alerts_resolve_with_the_batch(tmp_path) -> None:
    """Broker 2, a follower said nearing, becomes the leader: broker 3's observations name it.
    The collector observes followers only, so nothing else would end 2's status: its alerts
    resolve with that batch, the store and the state topic forget it, the report names it
    (for the state table). A follower naming the leader it named before changes nothing, and
    one naming a replica observed as a follower after that time does not drop it."""
    from streaming.sinks.outputs import KafkaStates

    clock, sink, producer = Clock(), Collect(), Producer()
    m = _monitor(tmp_path, clock, sink, state_topic=KafkaStates(producer, "isr.replica-state"))
    two = _follower(_row(100_000, 91_000, 5), 2, 1, [1, 2, 3])  # 9 s behind: nearing + imminent
    three = _follower(_row(100_000, 100_000, 5), 3, 1, [1, 2, 3])
    assert _apply(m, 0, [two, three]).started == 2
    key = ("c", "t", 0, 2)
    # broker 3 under leader 1 again: nothing new about 2
    report = _apply(m, 1, [_follower(_row(101_000, 101_000, 6), 3, 1, [1, 2, 3])])
    assert report.resolved == 0 and not report.leading and key in m.statuses
    # a round naming 2 leader, and 2 observed as a follower after it (metadata going back): kept
    report = _apply(m, 2, [_follower(_row(100_800, 91_000, 6), 2, 1, [1, 2, 3]),
                           _follower(_row(100_500, 100_500, 7), 3, 2, [2, 3])])  # fmt: skip
    assert report.resolved == 0 and not report.leading and key in m.statuses
    # broker 1's leadership moved to 2, as broker 3's newest observation says (and said before)
    report = _apply(m, 3, [_follower(_row(102_000, 102_000, 8), 3, 2, [2, 3])])
    assert report.leading == [("c", "t", 0, 2, 102_000)]
    assert report.resolved == 2 and not m.book.active
    assert key not in m.statuses and ("c", "t", 0, 3) in m.statuses
    assert "c/t/0/2" not in {status_key(s) for s in m.store.snapshot().statuses()}
    assert producer.records[-1] == ("isr.replica-state", b"c/t/0/2", None)  # a tombstone
    # a record from before the election read after it: ignored, named for the state table
    report = _apply(m, 4, [_follower(_row(101_500, 91_000, 7), 2, 1, [1, 2, 3])])
    assert report.late == [(*key, 102_000)] and key not in m.statuses and not m.book.active
    # 2 a follower again later: held again, from its own observations
    report = _apply(m, 5, [_follower(_row(110_000, 110_000, 1), 2, 3, [3, 2])])
    assert not report.late and key in m.statuses


def test_what_the_monitor_forgot_it_remembers_for_the_forget_time_only(tmp_path) -> None:
    """The memory of replicas said gone is bounded: past the forget time (on the cluster's clock)
    a record that old is the forget's (``Monitor.forget`` drops it within its minute)."""
    m = _monitor(None, Clock(), Collect())
    _apply(m, 0, [_row(100_000, 100_000, 5)])
    m.apply_statuses(1, [], gone=[("c", "t", 0, 2, 100_500)])
    m.forget(15 * 60_000)
    assert _apply(m, 2, [_row(100_200, 100_200, 6)]).late  # remembered
    later = 100_500 + 15 * 60_000 + 1
    _apply(m, 3, [{**_row(later, later, 1), "topic": "u"}])  # the cluster's clock, 15 minutes on
    m.forget(15 * 60_000)
    assert not _apply(m, 4, [_row(100_300, 100_300, 7)]).late  # no longer remembered: held,
    assert m.forget(15 * 60_000) == ["c/t/0/2"]  # and forgotten as any replica that old


def test_a_restarted_job_still_keeps_a_late_record_of_a_forgotten_replica_out(tmp_path) -> None:
    """The memory of forgotten replicas is in the driver's checkpoint: a record from before the
    gone, read after a restart, is late to the restarted job too; the memory's end is kept too."""
    m = _monitor(tmp_path, Clock(), Collect())
    _apply(m, 0, [_row(100_000, 100_000, 5)])
    m.apply_statuses(1, [], gone=[("c", "t", 0, 2, 100_500)])
    again = _monitor(tmp_path, Clock(), Collect())  # restarted on the same checkpoint
    report = _apply(again, 2, [_row(100_200, 100_200, 6)])
    assert report.late == [("c", "t", 0, 2, 100_500)] and ("c", "t", 0, 2) not in again.statuses
    # newer telemetry ends the memory, in the checkpoint as well
    _apply(again, 3, [_row(101_000, 101_000, 7)])
    third = _monitor(tmp_path, Clock(), Collect())
    assert not _apply(third, 4, [_row(100_900, 100_900, 8)]).late


def test_an_unreadable_memory_of_forgotten_replicas_is_logged_and_left(tmp_path, caplog) -> None:
    (tmp_path / "isrwatch").mkdir()
    (tmp_path / "isrwatch" / "forgotten.json").write_text('{"replicas": [["c", "t"]]}')
    with caplog.at_level(logging.WARNING):
        m = _monitor(tmp_path, Clock(), Collect())
    assert "forgotten_replicas_unreadable" in caplog.text
    assert not _apply(m, 0, [_row(100_000, 100_000, 5)]).late
