"""isrwatch.outcomes: each real shrink warned or missed, with its lead, and the warnings no shrink followed."""

from __future__ import annotations

import pytest

from isrwatch.alerts import Alert, AlertName, Transition, stale_alert
from isrwatch.outcomes import LEAD_BUCKETS_S, ShrinkOutcomes


def _alert(name: AlertName, broker_id: int = 2, partition: int = 0, cluster: str = "c1") -> Alert:
    labels = (
        ("broker_id", str(broker_id)),
        ("cluster", cluster),
        ("leader_id", "1"),
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
    o.settle({"c1": 40_000})
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
