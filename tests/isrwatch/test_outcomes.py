"""isrwatch.outcomes: each real shrink warned or missed, with its lead, and the warnings no shrink followed."""

from __future__ import annotations

import pytest

from isrwatch.alerts import Alert, AlertName, Transition, stale_alert
from isrwatch.outcomes import LEAD_BUCKETS_S, ShrinkOutcomes


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
