"""The rule against the seeds' story (KIP-16 and the burst example) and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isrwatch.rule import (
    FollowerState,
    Rule,
    RuleConfig,
    can_rejoin,
    caught_up_time,
    check_period_ms,
    chosen_rule,
    for_version,
    is_out_of_sync,
    leader_change_caught_up_time,
    new_leadership,
    observed_caught_up_time,
    on_fetch,
    removal_window,
    unseen_gap_caught_up_time,
)

LEGACY = RuleConfig(Rule.LEGACY_MESSAGES, lag_time_max_ms=10_000, lag_max_messages=4)
KIP16 = RuleConfig(Rule.KIP16, lag_time_max_ms=10_000)
REFINED = RuleConfig(Rule.KIP16_REFINED, lag_time_max_ms=10_000)


def burst_story(cfg: RuleConfig) -> list[tuple[int, str]]:
    """Two healthy followers fetching every 50 ms; at t=1010 a producer sends one
    batch of 4 messages; the leader checks its ISR at t=1020 and t=1200.
    Returns the ISR changes the leader makes: (time, 'shrink'|'expand')."""
    leader_leo = 0
    followers = {2: FollowerState.new(0), 3: FollowerState.new(0)}
    isr = {2, 3}
    changes = []
    for t in range(0, 1300, 10):
        if t == 1010:
            leader_leo += 4
        if t % 50 == 0:  # both followers fetch: they read everything up to the LEO
            for b, f in followers.items():
                followers[b] = on_fetch(f, cfg, t, f.leo, leader_leo)
                followers[b] = FollowerState(**{**followers[b].__dict__, "leo": leader_leo})
        if t in (1020, 1200):
            for b, f in followers.items():
                if b in isr and is_out_of_sync(f, cfg, t, leader_leo):
                    isr.discard(b)
                    changes.append((t, "shrink"))
        hw = min([leader_leo] + [followers[b].leo for b in isr])
        for b, f in followers.items():
            if b not in isr and can_rejoin(f.leo, hw):
                isr.add(b)
                changes.append((t, "expand"))
    return changes


def test_burst_of_max_messages_throws_healthy_followers_out_and_back_under_legacy() -> None:
    changes = burst_story(LEGACY)
    assert changes.count((1020, "shrink")) == 2
    expands = [t for t, c in changes if c == "expand"]
    assert len(expands) == 2 and all(1020 < t <= 1100 for t in expands)


def test_burst_leaves_isr_alone_under_kip16() -> None:
    assert burst_story(KIP16) == []
    assert burst_story(REFINED) == []


def test_legacy_three_behind_stays_four_behind_goes() -> None:
    f = FollowerState.new(0, leo=10)
    assert not is_out_of_sync(f, LEGACY, 100, leader_leo=13)
    assert is_out_of_sync(f, LEGACY, 100, leader_leo=14)


@pytest.mark.parametrize("cfg", [KIP16, REFINED])
def test_stuck_follower_leaves_between_maxlag_and_maxlag_plus_period(cfg: RuleConfig) -> None:
    leader_leo = 0
    f = FollowerState.new(0)
    # Fetches every 100 ms while a producer appends 1 message per 10 ms; stuck from t=5000.
    for t in range(0, 5000, 100):
        f = on_fetch(f, cfg, t, leader_leo, leader_leo)
        leader_leo += 10
    lcu = f.last_caught_up_ms
    assert 4800 <= lcu <= 4900
    period = check_period_ms(cfg)
    for phase in (0, 1, period // 3, period - 1):
        checks = range(phase, 60_000, period)
        removed = next(t for t in checks if is_out_of_sync(f, cfg, t, leader_leo + 1))
        earliest, latest = removal_window(lcu, cfg)
        assert earliest < removed <= latest


def test_check_period_is_maxlag_before_refined_and_half_after() -> None:
    assert check_period_ms(KIP16) == 10_000
    assert check_period_ms(LEGACY) == 10_000
    assert check_period_ms(REFINED) == 5_000


def test_bootstrapping_follower_stays_out_until_it_reaches_the_high_watermark() -> None:
    hw = 1000
    assert not can_rejoin(0, hw)
    assert not can_rejoin(999, hw)
    assert can_rejoin(1000, hw)
    # 2.1+: also the leader epoch start offset
    assert not can_rejoin(1000, hw, leader_epoch_start_offset=1200)
    assert can_rejoin(1200, hw, leader_epoch_start_offset=1200)


def test_refined_rule_keeps_a_follower_that_always_reads_the_previous_leo() -> None:
    """High volume: every fetch reaches the LEO seen at the previous fetch but
    never the current one (KAFKA-4485). 0.9's rule drops it; 0.10.2's does not."""
    results = {}
    for cfg in (KIP16, REFINED):
        f = FollowerState.new(0)
        leader_leo = 100
        for t in range(500, 30_000, 500):
            f = on_fetch(f, cfg, t, fetch_offset=leader_leo - 100, leader_leo=leader_leo)
            leader_leo += 100
        results[cfg.rule] = is_out_of_sync(f, cfg, 30_000, leader_leo)
    assert results == {Rule.KIP16: True, Rule.KIP16_REFINED: False}


def test_idle_follower_at_the_leader_leo_is_caught_up_under_refined_only() -> None:
    f = FollowerState.new(0, leo=42)
    assert not is_out_of_sync(f, REFINED, 60_000, leader_leo=42)
    assert is_out_of_sync(f, KIP16, 60_000, leader_leo=42)


def test_rule_names_parse_and_reject() -> None:
    assert Rule.parse("kip16") is Rule.KIP16
    with pytest.raises(ValueError, match="rule='kip17' is not one of"):
        Rule.parse("kip17")
    with pytest.raises(ValueError, match="lag_time_max_ms"):
        RuleConfig(lag_time_max_ms=0)


fetches = st.lists(
    st.tuples(st.integers(0, 500), st.integers(0, 50), st.integers(0, 50)),  # dt, follower behind, produced
    min_size=1,
    max_size=60,
)


@given(fetches, st.sampled_from(list(Rule)))
def test_lcu_never_decreases_and_never_exceeds_the_newest_fetch(steps: list[tuple[int, int, int]], rule: Rule) -> None:
    cfg = RuleConfig(rule, lag_time_max_ms=1000)
    f = FollowerState.new(0)
    t, leader_leo = 0, 0
    for dt, behind, produced in steps:
        t += dt
        leader_leo += produced
        fetch_offset = max(0, leader_leo - behind)
        before = f.last_caught_up_ms
        f = on_fetch(f, cfg, t, fetch_offset, leader_leo)
        assert f.last_caught_up_ms >= before
        assert f.last_caught_up_ms <= t
        if fetch_offset >= leader_leo:
            assert f.last_caught_up_ms == t
            assert not is_out_of_sync(f, cfg, t, leader_leo) or rule is Rule.LEGACY_MESSAGES


@given(
    st.sampled_from([Rule.KIP16, Rule.KIP16_REFINED]),
    st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=40),
)
def test_state_is_the_max_of_per_observation_caught_up_times(rule: Rule, steps: list[tuple[int, int, int]]) -> None:
    """What the streaming job relies on: folding on_fetch equals a max over
    caught_up_time of each observation with its previous one."""
    cfg = RuleConfig(rule, lag_time_max_ms=1000)
    f = FollowerState.new(0)
    best = 0
    t, leader_leo, prev_t, prev_l = 0, 0, None, None
    for dt, produced, behind in steps:
        t += dt
        leader_leo += produced
        off = max(0, leader_leo - behind)
        seen = caught_up_time(rule, t, off, leader_leo, prev_t, prev_l)
        best = max(best, seen) if seen is not None else best
        f = on_fetch(f, cfg, t, off, leader_leo)
        prev_t, prev_l = t, leader_leo
    assert f.last_caught_up_ms == best


# -- the monitor's inference across gaps in its evidence (docs/rule.md) --------

GAP_MS = 5_000


@pytest.mark.parametrize("rule", [Rule.KIP16, Rule.KIP16_REFINED])
def test_after_a_gap_a_follower_past_the_pre_gap_leader_leo_is_caught_up_at_the_observation(rule: Rule) -> None:
    """40 s without telemetry, then a follower 10 messages behind under load but
    far past where the leader was before the gap: caught up now, not 40 s ago."""
    t, prev_t = 1_040_000, 1_000_000
    assert observed_caught_up_time(rule, t, 9_990, 10_000, prev_t, 2_000, GAP_MS) == t
    # The broker's rule read alone: 40 s since caught up (refined) or nothing (0.9).
    assert caught_up_time(rule, t, 9_990, 10_000, prev_t, 2_000) == (prev_t if rule is Rule.KIP16_REFINED else None)


@pytest.mark.parametrize("rule", [Rule.KIP16, Rule.KIP16_REFINED])
def test_without_a_gap_the_observation_says_what_the_broker_rule_says(rule: Rule) -> None:
    t, prev_t = 1_000_500, 1_000_000
    for f, leader, prev_l in [(9_990, 10_000, 9_900), (9_800, 10_000, 9_900), (10_000, 10_000, 9_900)]:
        expected = caught_up_time(rule, t, f, leader, prev_t, prev_l)
        assert observed_caught_up_time(rule, t, f, leader, prev_t, prev_l, GAP_MS) == expected
    # A gap is longer than max_gap_ms: exactly max_gap_ms apart is not one.
    at_bound = observed_caught_up_time(rule, prev_t + GAP_MS, 9_990, 10_000, prev_t, 9_900, GAP_MS)
    assert at_bound == caught_up_time(rule, prev_t + GAP_MS, 9_990, 10_000, prev_t, 9_900)


@pytest.mark.parametrize("rule", [Rule.KIP16, Rule.KIP16_REFINED])
def test_a_follower_stuck_below_the_pre_gap_leader_leo_gains_nothing_from_the_gap(rule: Rule) -> None:
    t, prev_t = 1_040_000, 1_000_000
    assert observed_caught_up_time(rule, t, 1_500, 10_000, prev_t, 2_000, GAP_MS) is None
    # ...nor does a follower whose broker did not answer.
    assert observed_caught_up_time(rule, t, None, 10_000, prev_t, 2_000, GAP_MS) is None


@pytest.mark.parametrize("rule", list(Rule))
def test_an_idle_follower_is_caught_up_at_the_observation_gap_or_not(rule: Rule) -> None:
    for prev_t in (None, 1_039_500, 1_000_000):
        assert observed_caught_up_time(rule, 1_040_000, 500, 500, prev_t, 500, GAP_MS) == 1_040_000


def test_gap_inference_is_off_without_a_bound_and_for_the_legacy_rule() -> None:
    t, prev_t = 1_040_000, 1_000_000
    for rule in Rule:
        assert observed_caught_up_time(rule, t, 9_990, 10_000, prev_t, 2_000, None) == caught_up_time(
            rule, t, 9_990, 10_000, prev_t, 2_000
        )
    assert observed_caught_up_time(Rule.LEGACY_MESSAGES, t, 9_990, 10_000, prev_t, 2_000, GAP_MS) is None
    # The first observation of a replica has no previous one: nothing to bridge.
    assert observed_caught_up_time(Rule.KIP16_REFINED, t, 9_990, 10_000, None, None, GAP_MS) is None


offsets = st.one_of(st.none(), st.integers(0, 1000))


@given(
    st.sampled_from(list(Rule)),
    st.integers(0, 100_000),
    offsets,
    offsets,
    st.one_of(st.none(), st.integers(0, 100_000)),
    offsets,
    st.one_of(st.none(), st.integers(1, 50_000)),
)
def test_observed_caught_up_time_is_the_broker_rule_or_the_observation_time_after_a_gap(
    rule: Rule, t: int, f: int | None, leader: int | None, prev_t: int | None, prev_l: int | None, gap: int | None
) -> None:
    prev_t = None if prev_t is None else min(prev_t, t)  # telemetry never has prev_t_ms after t_ms
    broker = caught_up_time(rule, t, f, leader, prev_t, prev_l)
    seen = observed_caught_up_time(rule, t, f, leader, prev_t, prev_l, gap)
    bridged = (
        gap is not None
        and rule is not Rule.LEGACY_MESSAGES
        and prev_t is not None
        and t - prev_t > gap
        and f is not None
        and prev_l is not None
        and f >= prev_l
    )
    assert seen == (t if bridged else broker)
    assert broker is None or (seen is not None and broker <= seen <= t)


@given(
    st.sampled_from([Rule.KIP16, Rule.KIP16_REFINED]),
    st.integers(1_000, 20_000),
    st.lists(st.tuples(st.integers(1, 60_000), st.integers(0, 500), st.integers(0, 100)), min_size=1, max_size=40),
)
def test_a_follower_that_keeps_up_is_never_older_than_the_gap_bound_whatever_the_gaps(
    rule: Rule, gap: int, steps: list[tuple[int, int, int]]
) -> None:
    """Observations at any intervals, some far longer than the bound; at each,
    the follower has at least what the leader had at the previous one (under
    load it is rarely at the current LEO). Its age, as the monitor folds it, stays
    within the bound under the refined rule, and 0 at the end of every gap under
    both KIP-16 rules (0.9's has no previous-LEO branch to carry it between)."""
    lcu: int | None = None
    t, leader, prev_t, prev_l = 1_000_000, 0, None, None
    for dt, produced, behind in steps:
        t += dt
        f = max(prev_l or 0, leader + produced - behind)
        leader += produced
        seen = observed_caught_up_time(rule, t, f, leader, prev_t, prev_l, gap)
        lcu = seen if lcu is None or (seen is not None and seen > lcu) else lcu
        if prev_t is not None and t - prev_t > gap:
            assert lcu == t, "the end of a gap is where the evidence starts afresh"
        elif prev_t is not None and rule is Rule.KIP16_REFINED:
            assert lcu is not None and t - lcu <= t - prev_t <= gap
        prev_t, prev_l = t, leader


def test_an_observation_under_a_new_leader_is_caught_up_at_the_previous_observation() -> None:
    """A new leader starts an in-sync follower's clock at its election, which came
    after the follower's previous observation: that time; after a gap (or with no
    previous observation) the observation's own; nothing without a change or for a
    follower outside the ISR."""
    t, prev = 1_000_000, 999_000
    assert leader_change_caught_up_time(t, True, True, prev, GAP_MS) == prev
    assert leader_change_caught_up_time(t, True, True, t - GAP_MS - 1, GAP_MS) == t
    assert leader_change_caught_up_time(t, True, True, t - GAP_MS, GAP_MS) == t - GAP_MS
    assert leader_change_caught_up_time(t, True, True, None, GAP_MS) == t
    assert leader_change_caught_up_time(t, True, True, t - 60_000, None) == t - 60_000
    assert leader_change_caught_up_time(t, False, True, prev, GAP_MS) is None
    assert leader_change_caught_up_time(t, True, False, prev, GAP_MS) is None


@pytest.mark.parametrize("rule", [Rule.KIP16, Rule.KIP16_REFINED])
def test_an_unseen_gap_without_an_answer_starts_the_evidence_afresh(rule: Rule) -> None:
    """No prev_* from the collector, the job's previous observation more than the gap
    before, the broker silent: the observation's own time; nothing with an answer (the
    gap branch decides), within the gap, or under legacy-messages."""
    t = 1_000_000
    assert unseen_gap_caught_up_time(rule, t, None, t - GAP_MS - 1, GAP_MS) == t
    assert unseen_gap_caught_up_time(rule, t, None, t - GAP_MS, GAP_MS) is None
    assert unseen_gap_caught_up_time(rule, t, 5, t - GAP_MS - 1, GAP_MS) is None
    assert unseen_gap_caught_up_time(rule, t, None, None, GAP_MS) is None
    assert unseen_gap_caught_up_time(rule, t, None, t - GAP_MS - 1, None) is None
    assert unseen_gap_caught_up_time(Rule.LEGACY_MESSAGES, t, None, t - GAP_MS - 1, GAP_MS) is None


def test_a_former_leader_back_after_its_restart_is_not_paged_for_its_leadership() -> None:
    """The soak (2026-11-27): broker 2 followed orders-2 in sync, led it for eight minutes
    (the controller's preferred-leader election), was restarted, and came back a follower
    outside the ISR and silent, with no prev_* (the collector forgets a replica while it
    leads). The job took its catch-up from before its leadership and paged Nearing and
    Imminent as begun eight minutes earlier. Now its evidence starts at its return: out of
    sync for being outside the ISR, from then."""
    from isrwatch.alerts import AlertName, replica_alerts
    from isrwatch.episodes import walk
    from isrwatch.status import Thresholds

    cfg = RuleConfig(lag_time_max_ms=20_000)

    def obs(t, leo, leader_leo, prev, isr):
        o = {
            "topic": "orders",
            "partition": 2,
            "broker_id": 2,
            "leader_id": 3,
            "t_ms": t,
            "leo": leo,
            "leader_leo": leader_leo,
            "isr": isr,
            "replicas": (3, 1, 2),
        }
        if prev:
            o.update(prev_t_ms=t - 500, prev_leo=leo - 10, prev_leader_leo=leader_leo - 10)
        return o

    rows = [obs(t, 1000 + t // 50, 1000 + t // 50, t > 0, (3, 1, 2)) for t in range(0, 30_000, 500)]
    back = 30_000 + 480_000  # eight minutes as the leader: not observed as a follower
    rows += [obs(back, None, 90_000, False, (3, 1))]
    statuses = [s for _, s in walk([("c", o) for o in rows], cfg, Thresholds(), 10_000)]
    last = statuses[-1]
    assert last.lag_state.value == "out_of_sync"  # outside the ISR
    starts = {a.name: a.starts_ms for a in replica_alerts(last) if a.name is not AlertName.STALLED}
    assert starts and all(v >= back for v in starts.values()), starts


def test_a_new_leadership_is_another_leader_or_a_newer_epoch_of_the_same_one_both_known() -> None:
    assert new_leadership(2, 1, None, None)  # another leader, epochs unknown: as before epochs
    assert new_leadership(2, 1, 3, 3)
    assert new_leadership(1, 1, 5, 4)  # the same leader, a newer epoch (KRaft before 3.6-IV0: an ISR change)
    assert not new_leadership(1, 1, 4, 4)
    assert not new_leadership(1, 1, 3, 4)  # an older epoch (stale metadata) is not a new leadership
    for unknown in ((5, None), (None, 4), (5, -1), (-1, 4), (None, None)):
        assert not new_leadership(1, 1, *unknown)  # an unknown epoch: the leader id alone decides
    assert not new_leadership(-1, 1, 5, 4) and not new_leadership(1, -1, 5, 4)  # no leader


@pytest.mark.parametrize(
    ("version", "rule", "idle", "why"),
    [
        ("0.10.0", Rule.KIP16, False, "Kafka 0.10.0"),
        ("0.10.1", Rule.KIP16, False, "Kafka 0.10.1"),
        ("0.9", Rule.KIP16, False, "Kafka 0.9"),
        ("0.10.2", Rule.KIP16_REFINED, False, "Kafka 0.10.2"),
        ("2.0", Rule.KIP16_REFINED, False, "Kafka 2.0"),
        ("2.1", Rule.KIP16_REFINED, True, "Kafka 2.1"),
        ("4.0", Rule.KIP16_REFINED, True, "Kafka 4.0"),
        (None, Rule.KIP16_REFINED, True, "no Kafka version in the telemetry: the default"),
        ("0.8.2", Rule.KIP16_REFINED, True, "Kafka version '0.8.2' not known: the default"),
        ("2.1.0\n", Rule.KIP16_REFINED, True, "Kafka version '2.1.0\\n' not known: the default"),
        ("\u00b2.1", Rule.KIP16_REFINED, True, "Kafka version '\u00b2.1' not known: the default"),
    ],
)
def test_rule_auto_picks_the_variant_of_the_clusters_kafka_version(version, rule, idle, why) -> None:
    auto = RuleConfig(Rule.KIP16_REFINED, 10_000, by_version=True)
    assert chosen_rule(auto, version) == (rule, idle, why)
    assert for_version(auto, version) == RuleConfig(rule, 10_000, idle_is_caught_up=idle)
    assert check_period_ms(for_version(auto, version)) == (5_000 if rule is Rule.KIP16_REFINED else 10_000)
    given = RuleConfig(Rule.KIP16, 10_000)  # --rule given: every cluster, whatever its version
    assert chosen_rule(given, version) == (Rule.KIP16, True, "given by --rule") and for_version(given, version) is given


def test_legacy_messages_is_never_chosen_by_version() -> None:
    with pytest.raises(ValueError, match="never chosen by a cluster's version"):
        RuleConfig(Rule.LEGACY_MESSAGES, by_version=True)
