"""isrwatch.outcomes: each real shrink warned or missed, with its lead, and the warnings no shrink followed."""

from __future__ import annotations

import pytest

from isrwatch.alerts import Alert, AlertName, Transition, stale_alert
from isrwatch.outcomes import LEAD_BUCKETS_S, LagEvidence, ShrinkOutcomes
from isrwatch.status import State
from tests.exporter.samples import replica


def _alert(name: AlertName, broker_id: int = 2, partition: int = 0, cluster: str = "c1", leader: int = 1) -> Alert:
    labels = (
        ("broker_id", str(broker_id)),
        ("cluster", cluster),
        ("leader_id", str(leader)),
        ("partition", str(partition)),
        ("topic", "orders"),
    )
    return Alert(name, labels, "summary", "description", 0)


def _fire(o: ShrinkOutcomes, at_ms: int, *alerts: Alert) -> None:
    o.alerts(Transition(list(alerts), [], []), at_ms)


def _resolve(o: ShrinkOutcomes, at_ms: int, *alerts: Alert) -> None:
    o.alerts(Transition([], list(alerts), []), at_ms)


def test_a_shrink_inside_an_episode_is_warned_with_its_lead_from_the_first_alert() -> None:
    o = ShrinkOutcomes()
    nearing, imminent = _alert(AlertName.NEARING), _alert(AlertName.IMMINENT)
    _fire(o, 10_000, nearing)
    _fire(o, 13_000, imminent)  # the same episode: the lead counts from the first alert
    o.isr_change("c1", "orders", 0, 17_500, left=[2])
    c = o.snapshot()["c1"]
    assert c.shrinks == {"warned": 1, "missed": 0}
    assert c.lead_sum_s == pytest.approx(7.5)
    assert dict(c.cumulative())[5.0] == 0
    assert dict(c.cumulative())[10.0] == 1
    assert c.cumulative()[-1] == (float("inf"), 1)
    _resolve(o, 30_000, nearing, imminent)
    o.settle({"c1": 100_000})
    assert o.snapshot()["c1"].unfollowed == 0  # the follower left the ISR within it


def test_a_shrink_without_a_warning_or_before_it_is_missed() -> None:
    o = ShrinkOutcomes()
    o.isr_change("c1", "orders", 0, 5_000, left=[2])  # nothing fired
    _fire(o, 9_000, _alert(AlertName.NEARING, broker_id=3))
    o.isr_change("c1", "orders", 0, 9_000, left=[3])  # fired at the shrink's own time: not before it
    _fire(o, 20_000, _alert(AlertName.NEARING, partition=1))
    o.isr_change("c1", "orders", 1, 19_000, left=[2])  # read after the late warning: still missed
    o.isr_change("c1", "orders", 0, 12_000, left=[4])  # another follower's alert does not count
    assert o.snapshot()["c1"].shrinks == {"warned": 0, "missed": 4}


def test_a_shrink_metadata_showed_soon_after_its_episode_ended_was_warned_by_it() -> None:
    # A paused follower, warned from 10 s; the broker resumes and the job sees it caught up at
    # 24 s; the leader had dropped it just before, and metadata showed the new ISR at 24.3 s
    # (seen in a fresh-clone run of tests/e2e/test_broker_pauses.py): the warning was for that shrink.
    o = ShrinkOutcomes()  # settle_ms 10 s: how late metadata may show a shrink
    nearing = _alert(AlertName.NEARING)
    _fire(o, 10_000, nearing)
    _resolve(o, 24_000, nearing)
    assert o.isr_change("c1", "orders", 0, 24_300, left=[2]) == [(2, "warned", pytest.approx(14.3))]
    o.isr_change("c1", "orders", 0, 30_000, left=[], joined=[2])
    _fire(o, 40_000, nearing)
    _resolve(o, 44_000, nearing)
    assert o.isr_change("c1", "orders", 0, 54_001, left=[2]) == [(2, "missed", None)]  # ended > 10 s before
    o.settle({"c1": 200_000})
    c = o.snapshot()["c1"]
    assert c.shrinks == {"warned": 1, "missed": 1}
    assert c.unfollowed == 1  # the second episode: its shrink came too late to be its


def test_an_episode_that_ended_before_the_shrink_did_not_warn_of_it() -> None:
    o = ShrinkOutcomes(settle_ms=0)
    nearing = _alert(AlertName.NEARING)
    _fire(o, 1_000, nearing)
    _resolve(o, 4_000, nearing)
    o.isr_change("c1", "orders", 0, 8_000, left=[2])
    o.settle({"c1": 8_000})
    c = o.snapshot()["c1"]
    assert c.shrinks == {"warned": 0, "missed": 1}
    assert c.unfollowed == 1  # the follower stayed in the ISR through that episode


def test_stalled_warns_and_the_episode_lasts_until_its_last_alert_resolves() -> None:
    o = ShrinkOutcomes()
    stalled, nearing = _alert(AlertName.STALLED), _alert(AlertName.NEARING)
    _fire(o, 3_000, stalled)
    _fire(o, 5_000, nearing)
    _resolve(o, 6_000, nearing)  # stalled still holds
    o.isr_change("c1", "orders", 0, 6_500, left=[2])
    assert o.snapshot()["c1"].shrinks["warned"] == 1
    assert o.snapshot()["c1"].lead_sum_s == pytest.approx(3.5)


def test_unfollowed_warnings_wait_for_the_settle_time_and_ignore_other_alerts() -> None:
    o = ShrinkOutcomes(settle_ms=10_000)
    nearing = _alert(AlertName.NEARING)
    _fire(o, 1_000, nearing, stale_alert("c1", 0, 1_000))  # staleness is not a warning of a shrink
    _resolve(o, 5_000, nearing)
    o.settle({"c1": 14_000})
    assert o.snapshot()["c1"].unfollowed == 0  # not yet settled: a shrink may still be read
    o.isr_change("c1", "orders", 0, 4_000, left=[2])  # read late, inside the episode
    o.settle({"c1": 15_000})
    c = o.snapshot()["c1"]
    assert (c.shrinks["warned"], c.unfollowed) == (1, 0)
    o.isr_change("c1", "orders", 0, 10_000, left=[], joined=[2])  # back in the ISR
    _fire(o, 20_000, nearing)
    _resolve(o, 22_000, nearing)
    o.settle({"c1": 41_000})
    assert o.snapshot()["c1"].unfollowed == 0  # twice settle_ms: a leader's count read late may follow it
    o.settle({"c1": 42_000})
    assert o.snapshot()["c1"].unfollowed == 1


def test_a_warning_after_a_missed_shrink_is_not_a_false_alarm() -> None:
    o = ShrinkOutcomes(settle_ms=0)
    o.isr_change("c1", "orders", 0, 5_000, left=[2])
    nearing = _alert(AlertName.NEARING)
    _fire(o, 6_000, nearing)  # too late, but the follower is out of the ISR
    o.isr_change("c1", "orders", 0, 9_000, left=[], joined=[2])
    _resolve(o, 9_000, nearing)
    o.settle({"c1": 9_000})
    c = o.snapshot()["c1"]
    assert (c.shrinks, c.unfollowed) == ({"warned": 0, "missed": 1}, 0)


def test_an_episode_firing_at_a_restart_goes_on() -> None:
    o = ShrinkOutcomes()
    firing = Alert(**{**_alert(AlertName.NEARING).__dict__, "starts_ms": 2_000})
    o.resume([firing, stale_alert("c1", 0, 1_000)])
    o.isr_change("c1", "orders", 0, 12_000, left=[2])
    assert o.snapshot()["c1"].lead_sum_s == pytest.approx(10.0)


def test_counts_are_per_cluster_and_zero_for_clusters_asked_for() -> None:
    o = ShrinkOutcomes()
    _fire(o, 0, _alert(AlertName.NEARING, cluster="c2"))
    o.isr_change("c2", "orders", 0, 400_000, left=[2])  # a lead past the last bucket: +Inf only
    snap = o.snapshot(["c1"])
    assert list(snap) == ["c1", "c2"]
    assert snap["c1"].shrinks == {"warned": 0, "missed": 0}
    cumulative = snap["c2"].cumulative()
    assert cumulative[len(LEAD_BUCKETS_S) - 1] == (LEAD_BUCKETS_S[-1], 0)
    assert cumulative[-1] == (float("inf"), 1)


# The leaders' own counts (IsrShrinksPerSec): the shrinks metadata never showed.


def test_a_leaders_count_rise_metadata_never_showed_goes_to_its_warned_follower() -> None:
    o = ShrinkOutcomes(settle_ms=10_000)
    o.leader_count("c1", 1, 9_000, 5)  # the first reading: a baseline, nothing counted
    _fire(o, 10_000, _alert(AlertName.NEARING, broker_id=2, leader=1))
    _fire(o, 11_000, _alert(AlertName.NEARING, broker_id=3, leader=4))  # another leader's follower
    o.leader_count("c1", 1, 20_000, 6)  # one shrink between 9 s and 20 s
    assert o.settle({"c1": 29_999}) == []  # metadata may still show it
    assert o.settle({"c1": 30_000}) == [("c1", 1, ("c1", "orders", 0, 2), 20_000, "warned", 10.0)]
    c = o.snapshot()["c1"]
    assert (c.shrinks, c.lead_sum_s) == ({"warned": 1, "missed": 0}, 10.0)
    o.leader_count("c1", 1, 21_000, 7)  # a second shrink: the warning already has its shrink
    assert o.settle({"c1": 31_000}) == [("c1", 1, None, 21_000, "missed", None)]
    o.leader_count("c1", 4, 21_000, 0)
    o.leader_count("c1", 4, 22_000, 1)
    assert o.settle({"c1": 32_000})[0][1:5] == (4, ("c1", "orders", 0, 3), 22_000, "warned")
    assert o.snapshot()["c1"].shrinks == {"warned": 2, "missed": 1}


def test_a_shrink_metadata_showed_is_not_counted_again_from_the_leaders_count() -> None:
    o = ShrinkOutcomes(settle_ms=10_000)
    o.leader_count("c1", 1, 1_000, 0)
    _fire(o, 2_000, _alert(AlertName.NEARING, broker_id=2), _alert(AlertName.NEARING, broker_id=3))
    o.leader_count("c1", 1, 8_000, 1)  # one shrink removing both followers
    o.isr_change("c1", "orders", 0, 14_000, left=[2, 3], leader=1)  # metadata shows it 6 s later
    o.isr_change("c1", "orders", 0, 500, left=[2], leader=1)  # before the first reading: not in a rise
    assert o.settle({"c1": 100_000}) == []
    assert o.snapshot()["c1"].shrinks == {"warned": 2, "missed": 1}


def test_a_lower_count_is_a_restarted_broker_and_an_old_reading_is_ignored() -> None:
    o = ShrinkOutcomes(settle_ms=0)
    o.leader_count("c1", 1, 1_000, 40)
    o.leader_count("c1", 1, 2_000, 2)  # restarted: two shrinks since
    o.leader_count("c1", 1, 1_500, 90)  # read before the last reading
    assert [u.outcome for u in o.settle({"c1": 3_000})] == ["missed", "missed"]


def test_a_warning_over_before_the_counts_window_does_not_take_the_shrink() -> None:
    o = ShrinkOutcomes(settle_ms=1_000)
    nearing = _alert(AlertName.NEARING)
    o.leader_count("c1", 1, 0, 0)
    _fire(o, 1_000, nearing)
    _resolve(o, 3_000, nearing)
    o.leader_count("c1", 1, 4_000, 0)
    o.leader_count("c1", 1, 5_000, 1)  # the shrink came after the warning resolved
    assert o.settle({"c1": 6_000}) == [("c1", 1, None, 5_000, "missed", None)]
    _fire(o, 6_000, nearing)
    _resolve(o, 6_500, nearing)  # resolved inside the window the count rose in: it may be its shrink
    o.leader_count("c1", 1, 7_000, 2)
    assert o.settle({"c1": 8_000})[0].outcome == "warned"
    o.settle({"c1": 60_000})
    assert o.snapshot()["c1"].unfollowed == 1  # the first warning; the second had its shrink


def test_a_shrink_metadata_showed_and_no_leader_counted_does_not_hide_a_later_one() -> None:
    """The controller removing a dead broker from an ISR: metadata shows it, no leader counts it."""
    o = ShrinkOutcomes(settle_ms=10_000)
    o.leader_count("c1", 1, 1_000, 0)
    o.isr_change("c1", "orders", 0, 5_000, left=[3], leader=1)  # the controller's: missed, no rise
    _fire(o, 20_000, _alert(AlertName.NEARING, broker_id=2))
    o.leader_count("c1", 1, 29_000, 0)
    o.leader_count("c1", 1, 30_000, 1)  # a shrink metadata never showed
    assert [u.outcome for u in o.settle({"c1": 40_000})] == ["warned"]
    assert o.snapshot()["c1"].shrinks == {"warned": 1, "missed": 1}


# The brokers' replica.lag.time.max.ms against the job's (Kafka 0.9 shows it nowhere).


def _behind(
    o: ShrinkOutcomes, at_ms: int, caught_up_ms: int, broker_id: int = 2, partition: int = 0, cluster: str = "c1",
    leader: int = 1, lag_ms: int = 30_000,
) -> None:  # fmt: skip
    """The job holds the follower not ok at ``at_ms``, last caught up at ``caught_up_ms``."""
    o.behind(
        replica(
            broker_id, State.NEARING, cluster=cluster, partition=partition, leader_id=leader, eval_ms=at_ms,
            ratio=(at_ms - caught_up_ms) / lag_ms, lag_time_max_ms=lag_ms,
        )
    )  # fmt: skip


def _warned(o: ShrinkOutcomes, partition: int, caught_up_ms: int) -> None:
    """Follower 2 of ``partition`` (leader 1, the job's lag 30 s), last caught up at
    ``caught_up_ms``, warned 15 s later."""
    _behind(o, caught_up_ms + 15_000, caught_up_ms, partition=partition)
    _fire(o, caught_up_ms + 15_000, _alert(AlertName.NEARING, partition=partition))


def test_a_leader_dropping_a_follower_sooner_than_the_lag_allows_is_evidence_of_a_shorter_lag() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    o.leader_count("c1", 1, 0, 0)
    _warned(o, 0, caught_up_ms=1_000)
    o.leader_count("c1", 1, 20_000, 1)
    o.isr_change("c1", "orders", 0, 20_500, left=[2], leader=1)  # 19.5 s after the catch-up; the lag: 30 s
    assert o.take_evidence() == []  # not yet: the leader's count has to show the shrink was its own
    o.settle({"c1": 30_000})
    assert o.take_evidence() == [LagEvidence("c1", "shorter", ("c1", "orders", 0, 2), 1, 30_000, 19_500, 20_500)]
    assert o.take_evidence() == []  # taken once
    assert o.snapshot()["c1"].evidence == {"shorter": 1, "longer": 0}


def test_a_shrink_at_the_lag_less_the_margin_is_no_evidence() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    o.leader_count("c1", 1, 0, 0)
    _warned(o, 0, caught_up_ms=1_000)
    _warned(o, 1, caught_up_ms=1_001)
    o.leader_count("c1", 1, 28_500, 2)
    o.isr_change("c1", "orders", 0, 29_000, left=[2], leader=1)  # 28 s: the lag less the margin
    o.isr_change("c1", "orders", 1, 29_000, left=[2], leader=1)  # 27.999 s
    o.settle({"c1": 100_000})
    assert [(e.replica[2], e.behind_ms) for e in o.take_evidence()] == [(1, 27_999)]
    assert o.snapshot()["c1"].evidence["shorter"] == 1


def test_a_shrink_only_metadata_shows_is_no_evidence_the_controller_removes_dead_brokers_too() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    _warned(o, 0, caught_up_ms=1_000)
    o.isr_change("c1", "orders", 0, 20_000, left=[2], leader=1)  # no leader count read yet
    o.leader_count("c1", 1, 25_000, 5)
    _warned(o, 1, caught_up_ms=26_000)
    o.isr_change("c1", "orders", 1, 45_000, left=[2], leader=1)  # counts read, none rose: the controller's
    o.leader_count("c1", 1, 50_000, 5)
    o.settle({"c1": 100_000})
    assert o.take_evidence() == []
    _warned(o, 2, caught_up_ms=100_000)
    o.leader_count("c1", 1, 120_000, 6)  # the leader's own, metadata never showed it: evidence
    o.settle({"c1": 130_000})
    assert [(e.direction, e.replica[2], e.behind_ms) for e in o.take_evidence()] == [("shorter", 2, 20_000)]


def _held_out_of_sync(o: ShrinkOutcomes, cluster: str = "c1", counts: bool = True, shrinks: int = 0) -> None:
    """Follower 2 (leader 1, the job's lag 10 s) last caught up at 1 s, held not ok until 24 s:
    a leader with a 10 s lag drops it by 1 + 2 x 10 + 2 (the margin) = 23 s."""
    if counts:
        o.leader_count(cluster, 1, 0, 0)
    _behind(o, 6_000, 1_000, cluster=cluster, lag_ms=10_000)
    _fire(o, 6_000, _alert(AlertName.NEARING, cluster=cluster))
    _behind(o, 15_000, 1_000, cluster=cluster, lag_ms=10_000)
    _behind(o, 24_000, 1_000, cluster=cluster, lag_ms=10_000)
    if counts:
        o.leader_count(cluster, 1, 25_000, shrinks)  # none by default


def test_a_follower_held_out_of_sync_past_twice_the_lag_and_never_dropped_is_evidence_of_a_longer_lag() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    _held_out_of_sync(o)
    o.settle({"c1": 42_999})  # a count read late could still show the shrink
    assert o.take_evidence() == []
    o.settle({"c1": 43_000})  # 23 s + 2 x settle_ms
    assert o.take_evidence() == [LagEvidence("c1", "longer", ("c1", "orders", 0, 2), 1, 10_000, 23_000, 24_000)]
    assert o.snapshot()["c1"].evidence == {"shorter": 0, "longer": 1}


def test_without_the_leaders_count_a_missing_shrink_proves_nothing() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    _held_out_of_sync(o, "c1")
    _held_out_of_sync(o, "c2", counts=False)  # metadata only: on 0.9 it misses quick shrinks
    o.settle({"c1": 100_000, "c2": 100_000})
    assert [(e.cluster, e.direction) for e in o.take_evidence()] == [("c1", "longer")]
    assert o.snapshot()["c2"].evidence == {"shorter": 0, "longer": 0}


def test_a_leader_change_or_a_shrink_no_metadata_named_stops_the_longer_evidence() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    _held_out_of_sync(o, "c1")
    _behind(o, 24_500, 1_000, cluster="c1", leader=3, lag_ms=10_000)  # a new leader: its own clock
    _behind(o, 5_000, 4_000, partition=1, cluster="c2", lag_ms=10_000)
    _fire(o, 5_000, _alert(AlertName.NEARING, partition=1, cluster="c2"))  # warned first: it gets the shrink
    _held_out_of_sync(o, "c2", shrinks=1)  # leader 1 dropped one of them, metadata never said which
    _held_out_of_sync(o, "c3")
    o.settle({"c1": 100_000, "c2": 100_000, "c3": 100_000})
    assert [(e.cluster, e.direction) for e in o.take_evidence()] == [("c3", "longer")]


def test_each_evidence_is_counted_once_per_episode() -> None:
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    o.leader_count("c1", 1, 0, 0)
    _warned(o, 0, caught_up_ms=1_000)
    o.leader_count("c1", 1, 20_000, 1)
    o.isr_change("c1", "orders", 0, 20_500, left=[2], leader=1)
    o.isr_change("c1", "orders", 0, 21_000, left=[], joined=[2])
    o.leader_count("c1", 1, 23_000, 2)  # dropped again within the same episode
    o.isr_change("c1", "orders", 0, 23_500, left=[2], leader=1)
    o.settle({"c1": 40_000})
    assert [e.direction for e in o.take_evidence()] == ["shorter"]
    _held_out_of_sync(o, "c2")
    for now in (43_000, 50_000, 60_000):
        _behind(o, now, 1_000, cluster="c2", lag_ms=10_000)
        o.leader_count("c2", 1, now, 0)
        o.settle({"c2": now})
    assert [e.direction for e in o.take_evidence()] == ["longer"]
    assert (o.snapshot()["c1"].evidence, o.snapshot()["c2"].evidence) == (
        {"shorter": 1, "longer": 0},
        {"shorter": 0, "longer": 1},
    )


def test_a_follower_dropped_after_twice_the_lag_is_still_evidence_of_a_longer_lag() -> None:
    """The job's lag 10 s: a leader with it drops the follower by D = 23 s. This one dropped it
    at 26 s (its lag is longer, by less than twice), metadata said so at 34 s (D + settle_ms + 1),
    before the evidence was decided at 43 s. The same drop shown by metadata at 33 s may be the
    controller's removal of a broker whose session expired by D: no evidence."""
    o = ShrinkOutcomes(settle_ms=10_000, lag_margin_ms=2_000)
    for cluster, shown_ms in (("c1", 34_000), ("c2", 33_000)):
        _held_out_of_sync(o, cluster)
        o.leader_count(cluster, 1, 26_000, 1)
        o.isr_change(cluster, "orders", 0, shown_ms, left=[2], leader=1)
    o.settle({"c1": 43_000, "c2": 43_000})
    assert o.take_evidence() == [LagEvidence("c1", "longer", ("c1", "orders", 0, 2), 1, 10_000, 23_000, 24_000)]


def test_two_clusters_numbering_their_brokers_alike_are_counted_apart() -> None:
    """Issue 52: a warning of broker 2 of one cluster does not warn of a shrink of broker 2 of
    another with the same topic; each leader's own count is its cluster's."""
    o = ShrinkOutcomes(settle_ms=0)
    _fire(o, 10_000, _alert(AlertName.NEARING, cluster="alpha"))
    o.isr_change("beta", "orders", 0, 15_000, left=[2], leader=1)
    o.leader_count("alpha", 1, 1_000, 5)
    o.leader_count("beta", 1, 1_000, 9)
    o.leader_count("beta", 1, 20_000, 10)
    assert o.snapshot()["beta"].shrinks == {"warned": 0, "missed": 1}
    assert o.snapshot()["alpha"].shrinks == {"warned": 0, "missed": 0}
    o.isr_change("alpha", "orders", 0, 16_000, left=[2], leader=1)
    assert o.snapshot()["alpha"].shrinks == {"warned": 1, "missed": 0}
    assert o.snapshot()["beta"].shrinks == {"warned": 0, "missed": 1}
