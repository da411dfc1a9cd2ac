"""Replica evaluation: lag ratio, states, frozen ages, stalled brokers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import (
    ReplicaAggregate,
    State,
    Thresholds,
    evaluate,
    status_from_json,
    status_key,
    status_to_json,
)

CFG = RuleConfig(Rule.KIP16_REFINED, lag_time_max_ms=10_000)
TH = Thresholds()
T0 = 1_700_000_000_000


def agg(**kw: object) -> ReplicaAggregate:
    base = dict(
        cluster="c1",
        topic="orders",
        partition=3,
        broker_id=2,
        first_t_ms=T0,
        last_t_ms=T0 + 20_000,
        last_caught_up_ms=T0 + 20_000,
        last_answer_ms=T0 + 20_000,
        last_leader_answer_ms=T0 + 20_000,
        last_progress_ms=T0 + 20_000,
        leader_id=1,
        leo=100,
        leader_leo=100,
        hw=100,
        isr=(1, 2, 3),
        replicas=(1, 2, 3),
        lag_time_max_ms=None,
        min_isr=2,
    )
    base.update(kw)
    return ReplicaAggregate(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("behind_ms", "state"),
    [(0, State.OK), (4_999, State.OK), (5_000, State.NEARING), (8_000, State.CRITICAL), (10_000, State.OUT_OF_SYNC)],
)
def test_states_follow_the_lag_ratio(behind_ms: int, state: State) -> None:
    now = T0 + 20_000
    s = evaluate(agg(last_caught_up_ms=now - behind_ms, leo=90, leader_leo=100), now, CFG, TH)
    assert s.state is state
    assert s.lag_ratio == pytest.approx(behind_ms / 10_000)
    assert s.time_since_caught_up_s == pytest.approx(behind_ms / 1000)
    assert s.time_to_shrink_s == pytest.approx(max(0, 10_000 - behind_ms) / 1000)
    assert s.offset_lag == 10
    assert (s.shrink_window_start_ms, s.shrink_window_end_ms) == (now - behind_ms + 10_000, now - behind_ms + 15_000)


def test_lag_time_from_telemetry_wins_over_the_default() -> None:
    now = T0 + 20_000
    s = evaluate(agg(last_caught_up_ms=now - 6_000, leo=1, lag_time_max_ms=30_000), now, CFG, TH)
    assert s.lag_ratio == pytest.approx(0.2) and s.state is State.OK and s.lag_time_max_ms == 30_000


def test_a_telemetry_gap_freezes_ages_instead_of_raising_alerts() -> None:
    # Leader last answered at +20 s; the cluster clock moved on to +60 s (leader unreachable).
    a = agg(
        last_caught_up_ms=T0 + 19_000, leo=90, leader_leo=None, known_leader_leo=100, last_leader_answer_ms=T0 + 20_000
    )
    s = evaluate(a, T0 + 60_000, CFG, TH)
    assert s.state is State.OK
    assert s.time_since_caught_up_s == pytest.approx(1.0)


def test_a_silent_follower_broker_whose_leader_moves_is_stalled() -> None:
    a = agg(leo=None, known_leo=90, leader_leo=120, last_answer_ms=T0 + 10_000, last_caught_up_ms=T0 + 10_000)
    s = evaluate(a, T0 + 20_000, CFG, TH)
    assert s.state is State.STALLED
    # the same follower answering but not moving is lagging, not stalled
    s2 = evaluate(replace(a, leo=90, last_answer_ms=T0 + 20_000), T0 + 20_000, CFG, TH)
    assert s2.state is State.OUT_OF_SYNC


def test_a_stalled_follower_stays_stalled_through_a_round_its_leader_missed() -> None:
    """Seen on real Kafka with a broker killed: the leader missed one round's deadline, and the
    follower's Stalled fired and resolved at the same evaluation time (``now``, the leader's last
    answer, had not moved)."""
    a = agg(leo=None, known_leo=90, leader_leo=120, last_answer_ms=T0 + 10_000, last_leader_answer_ms=T0 + 20_000)
    assert evaluate(a, T0 + 20_000, CFG, TH).state is State.STALLED
    missed = replace(a, leader_leo=None, known_leader_leo=120)
    assert evaluate(missed, T0 + 21_000, CFG, TH).state is State.STALLED
    # a paused leader whose follower still answers: nothing against the follower
    quiet = agg(leo=None, known_leo=90, leader_leo=None, known_leader_leo=120, last_answer_ms=T0 + 20_000,
                last_leader_answer_ms=T0 + 18_000)  # fmt: skip
    assert evaluate(quiet, T0 + 25_000, CFG, TH).state is not State.STALLED


def test_a_follower_outside_the_isr_is_out_of_sync_until_it_rejoins() -> None:
    now = T0 + 20_000
    out = evaluate(agg(isr=(1, 3)), now, CFG, TH)
    assert out.state is State.OUT_OF_SYNC and not out.in_isr and out.isr_size == 2
    assert evaluate(agg(), now, CFG, TH).state is State.OK


def test_idle_partition_is_never_lagging_under_refined() -> None:
    now = T0 + 600_000
    s = evaluate(agg(last_caught_up_ms=T0, leo=100, leader_leo=100, last_leader_answer_ms=now), now, CFG, TH)
    assert s.state is State.OK and s.lag_ratio == 0.0


def test_legacy_rule_counts_messages() -> None:
    cfg = RuleConfig(Rule.LEGACY_MESSAGES, lag_time_max_ms=10_000, lag_max_messages=4)
    now = T0 + 20_000
    assert evaluate(agg(leo=96, leader_leo=100), now, cfg, TH).state is State.OUT_OF_SYNC
    three_behind = evaluate(agg(leo=97, leader_leo=100), now, cfg, TH)
    assert three_behind.state is State.NEARING and three_behind.lag_ratio == pytest.approx(0.75)
    assert evaluate(agg(leo=100, leader_leo=100), now, cfg, TH).state is State.OK


def test_status_json_round_trips_and_keys_are_stable() -> None:
    s = evaluate(agg(), T0 + 20_000, CFG, TH)
    assert status_from_json(status_to_json(s)) == s
    assert status_key(s) == "c1/orders/3/2"


def test_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="nearing_ratio"):
        Thresholds(nearing_ratio=0.9, critical_ratio=0.8)


@given(
    st.integers(0, 50_000),
    st.one_of(st.none(), st.integers(0, 50_000)),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_a_replica_without_new_telemetry_keeps_its_status_as_the_cluster_clock_moves(
    leader_answer: int, lcu: int | None, later1: int, later2: int, leo: int
) -> None:
    """What lets the job evaluate only the replicas of each batch: past the
    replica's newest observation, the cluster clock no longer changes it."""
    a = agg(
        first_t_ms=T0,
        last_t_ms=T0 + 50_000,
        last_leader_answer_ms=T0 + leader_answer,
        last_caught_up_ms=None if lcu is None else T0 + lcu,
        leo=leo,
        leader_leo=10**6,
    )
    at_last = evaluate(a, a.last_t_ms, CFG, TH)
    assert evaluate(a, a.last_t_ms + later1, CFG, TH) == at_last == evaluate(a, a.last_t_ms + later2, CFG, TH)
