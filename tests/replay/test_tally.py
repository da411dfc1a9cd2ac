"""replay.tally: what one setting's transitions add up to (pure Python)."""

from __future__ import annotations

import pytest

from replay.tally import Transition, tally

A = ("c", "orders", 0, 2)
B = ("c", "orders", 0, 3)
C = ("c", "payments", 1, 3)


def tr(key, t, out, replicas=3, min_isr=2):
    return Transition(key, t, out, replicas, min_isr)


def test_a_quick_return_is_a_flap_and_a_long_absence_is_not() -> None:
    got = tally([tr(A, 1_000, True), tr(A, 3_000, False), tr(C, 1_000, True), tr(C, 41_000, False)], 50_000, 10_000)
    assert (got.shrinks, got.expands, got.flaps) == (2, 2, 1)
    assert got.replica_seconds_out == pytest.approx(2.0 + 40.0)
    assert got.shrinks_by_broker[("c", 3)] == 1 and got.shrinks_by_broker[("c", 2)] == 1


def test_a_follower_still_out_counts_to_the_end_and_order_does_not_matter() -> None:
    got = tally([tr(A, 9_000, False), tr(A, 20_000, True), tr(A, 5_000, True)], 30_000, 10_000)
    # 5 s out, back at 9 s (a flap), out again at 20 s until the end
    assert (got.shrinks, got.expands, got.flaps) == (2, 1, 1)
    assert got.replica_seconds_out == pytest.approx(4.0 + 10.0)
    assert got.shrink_events == [(A, 5_000), (A, 20_000)]


def test_repeated_verdicts_are_not_new_shrinks() -> None:
    got = tally([tr(A, 1_000, True), tr(A, 2_000, True), tr(A, 3_000, False), tr(A, 4_000, False)], 5_000, 10_000)
    assert (got.shrinks, got.expands) == (1, 1)


def test_under_min_isr_while_two_of_three_replicas_are_out() -> None:
    got = tally([tr(A, 1_000, True), tr(B, 2_000, True), tr(A, 5_000, False), tr(B, 8_000, False)], 10_000, 10_000)
    assert got.under_min_isr_partitions == 1
    assert got.under_min_isr_seconds == pytest.approx(3.0)  # 2 s .. 5 s: one replica in sync of 3, min 2


def test_a_partition_without_min_isr_in_its_telemetry_is_not_counted() -> None:
    got = tally([tr(A, 1_000, True, None, None), tr(B, 2_000, True, None, None)], 10_000, 10_000)
    assert got.under_min_isr_partitions == 0 and got.shrinks == 2


def test_the_json_names_the_worst_first() -> None:
    d = tally([tr(A, 1, True), tr(A, 2, False), tr(A, 3, True), tr(C, 1, True)], 10, 10_000).as_dict(top=1)
    assert d["worst_partitions"] == [{"cluster": "c", "topic": "orders", "partition": 0, "shrinks": 2}]
    assert {"shrinks", "expands", "flaps"} <= d.keys()


def test_the_table_gives_each_setting_a_line_and_the_advice_with_its_caveats() -> None:
    from replay.main import render_table

    base = tally([tr(A, 1_000, True), tr(A, 2_000, False)], 10_000, 10_000).as_dict(top=3)
    longest = {"seconds": 7.5, "cluster": "c", "topic": "orders", "partition": 0, "broker_id": 2, "at_ms": 5}
    result = {
        "records": 10, "observations": 30, "rejected_records": 1, "rejected_observations": 0,
        "start_ms": 0, "end_ms": 10_000,
        "settings": [
            {"rule": "legacy-messages", "lag_time_max_ms": 10_000, "lag_max_messages": 4000, **base,
             "longest_recovered": None},
            {"rule": "kip16", "lag_time_max_ms": None, "lag_max_messages": None, **base, "longest_recovered": longest},
        ],
    }  # fmt: skip
    lines = render_table(result).splitlines()
    assert lines[0].startswith("replayed 10 records, 30 observations over 10 s (1 records")
    assert lines[2].split()[:6] == ["legacy-messages", "10000", "4000", "1", "1", "1"]
    assert lines[3].split()[:3] == ["kip16", "recorded", "-"]
    assert "was 7.5 s (orders-0 on broker 2): a replica.lag.time.max.ms above 7500 ms" in lines[5]
    assert lines[6].startswith("caveats:")


def test_a_warning_before_a_shrink_is_its_lead_and_a_jump_straight_out_has_none() -> None:
    got = tally(
        [
            Transition(A, 1_000, False, warning=True),
            Transition(A, 6_000, True),
            Transition(A, 9_000, False),
            Transition(B, 2_000, True),  # straight out, no warning
            Transition(B, 3_000, False),
            Transition(B, 4_000, False, warning=True),  # warned, then back to ok: no shrink
            Transition(B, 5_000, False),
        ],
        10_000,
        10_000,
    )
    assert sorted(got.warning_leads_s) == [0.0, 5.0]
    d = got.as_dict(top=3)
    assert (d["shrinks_warned"], d["warning_lead_s_median"]) == (1, 2.5)
    assert got.out_over_time == [(2_000, 1), (3_000, 0), (6_000, 1), (9_000, 0)]
