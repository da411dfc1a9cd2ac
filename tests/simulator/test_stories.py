"""The seeds' story, told by the simulator's brokers and checked with ``isrwatch.rule``.

Each test runs a scenario faster than real time and compares the true ISR
changes the simulated leaders and controller made with what the rule derives
from the emitted telemetry.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from isrwatch.alerts import AlertName, replica_alerts
from isrwatch.episodes import walk
from isrwatch.rule import Rule, RuleConfig, check_period_ms, removal_window
from isrwatch.status import Thresholds
from simulator import ProduceProfile, Scenario
from simulator.faults import (
    AtLeaderCheck,
    BrokerPause,
    EpochPerIsrChange,
    FetcherSlowdown,
    FetcherStall,
    FollowerBootstrap,
)
from simulator.profiles import BURST, STEADY
from simulator.scenarios import EPOCH_STOP_BEFORE_MS, FAULT_START_MS
from tests.simulator.replay import START_MS, RuleReplay, key, observations, run

LAG = 10_000
CFG = RuleConfig(lag_time_max_ms=LAG)


def fault_partitions(sim, follower: int, leader: int) -> set[tuple[str, int, int]]:
    """(topic, partition, follower) of every partition the fetcher (follower <- leader) serves."""
    return {
        (p.topic, p.index, follower)
        for p in sim.engine.partitions
        if p.replicas[0] == leader and follower in p.replicas[1:]
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stuck_follower_is_shrunk_inside_the_predicted_window_and_rejoins(seed):
    sim, records = run("stuck-follower", 60, seed=seed, mode="fetch")
    (stall,) = sim.scenario.faults
    assert isinstance(stall, FetcherStall)
    victims = fault_partitions(sim, stall.follower, stall.leader)
    assert victims, "the fault must hit at least one partition"

    shrinks = [c for c in sim.truth if c.change == "shrink"]
    assert {(c.topic, c.partition, b) for c in shrinks for b in c.brokers} == victims
    assert all(c.cause == "leader-check" for c in shrinks)

    obs = list(observations(records))
    for c in shrinks:
        (follower,) = c.brokers
        # The leader's own lastCaughtUpTimeMs equals what the rule derives from the fetches.
        replay = RuleReplay().feed(obs, until_ms=c.t_ms)
        lcu = replay.lcu[(c.topic, c.partition, follower)]
        assert c.last_caught_up_ms == (lcu,)
        # the last fetch sent before the stall may reach the leader one latency later
        assert START_MS + stall.at_ms - 1000 <= lcu <= START_MS + stall.at_ms + sim.spec.latency_ms[1]
        earliest, latest = removal_window(lcu, CFG)
        assert earliest < c.t_ms <= latest

    expands = [c for c in sim.truth if c.change == "expand"]
    assert {(c.topic, c.partition, b) for c in expands for b in c.brokers} == victims
    assert all(c.t_ms > START_MS + stall.until_ms for c in expands)


@pytest.mark.parametrize("seed", [1, 2])
def test_stuck_follower_poll_telemetry_agrees_with_the_broker_within_one_interval(seed):
    """The collector-like view: lcu at most one poll interval before the leader's own, and after
    it only by the fetch the leader never saw (the follower caught up on its last response)."""
    sim, records = run("stuck-follower", 40, seed=seed)
    shrinks = [c for c in sim.truth if c.change == "shrink"]
    assert shrinks
    obs = list(observations(records))
    for c in shrinks:
        (follower,) = c.brokers
        (true_lcu,) = c.last_caught_up_ms
        seen = RuleReplay().feed(obs, until_ms=c.t_ms).lcu[(c.topic, c.partition, follower)]
        tick = sim.spec.produce_tick_ms * 1.2 + 2 * sim.spec.latency_ms[1]
        assert true_lcu - sim.interval_ms - tick <= seen <= true_lcu + tick
        earliest, latest = removal_window(seen, CFG)
        assert earliest - tick < c.t_ms <= latest + sim.interval_ms + tick


def test_slow_follower_still_fetching_is_shrunk_by_time_not_by_silence():
    sim, records = run("slow-follower", 40, seed=1, mode="fetch")
    (slow,) = sim.scenario.faults
    assert isinstance(slow, FetcherSlowdown)
    victims = fault_partitions(sim, slow.follower, slow.leader)
    shrinks = [c for c in sim.truth if c.change == "shrink"]
    assert {(c.topic, c.partition, b) for c in shrinks for b in c.brokers} == victims
    obs = list(observations(records))
    for c in shrinks:
        (follower,) = c.brokers
        (lcu,) = c.last_caught_up_ms
        assert lcu > START_MS + slow.at_ms  # it kept up for a while after slowing down
        assert removal_window(lcu, CFG)[0] < c.t_ms <= removal_window(lcu, CFG)[1]
        # Unlike a stuck fetcher it kept fetching, and making progress, up to the shrink.
        late = [o for o in obs if key(o) == (c.topic, c.partition, follower) and lcu + LAG / 2 < o.t_ms <= c.t_ms]
        assert len(late) >= 3
        assert late[-1].leo > late[0].leo


@pytest.mark.parametrize("scenario", ["steady", "burst", "low-volume"])
def test_healthy_scenarios_never_shrink_nor_come_near_the_threshold(scenario):
    sim, records = run(scenario, 300, seed=7)
    assert [c for c in sim.truth if c.change == "shrink"] == []
    replay = RuleReplay().feed(observations(records))
    followers = {(p.topic, p.index, r) for p in sim.engine.partitions for r in p.replicas[1:]}
    assert set(replay.max_age_ms) == followers
    assert max(replay.max_age_ms.values()) / LAG < 0.3


@pytest.mark.slow  # ~15 s of simulated load (make test runs it; make test-unit leaves it)
def test_burst_is_absorbed_by_every_follower_well_under_five_seconds():
    sim, records = run("burst", 130, seed=4, mode="fetch")
    assert sim.truth == []
    replay = RuleReplay().feed(observations(records))
    # The leaders' own view (the fetches): at no fetch was a follower 5 s past caught up.
    assert max(replay.max_age_ms.values()) < 5_000
    # And the bursts really happened: followers fetched from far behind the leader LEO.
    obs = list(observations(records))
    assert any(o.leader_leo - o.leo >= sim.scenario.profile.burst_messages / 2 for o in obs)


def test_broker_pause_leads_to_controller_removal_and_new_leaders():
    sim, records = run("broker-pause", 60, seed=1)
    (pause,) = sim.scenario.faults
    assert isinstance(pause, BrokerPause)
    b = pause.broker
    expired = START_MS + pause.at_ms + sim.spec.session_timeout_ms
    holding = [p for p in sim.engine.partitions if b in p.replicas]
    led = {(p.topic, p.index) for p in holding if p.replicas[0] == b}
    assert led

    shrinks = [c for c in sim.truth if c.change == "shrink"]
    assert all(c.cause == "controller" and c.t_ms == expired and c.brokers == (b,) for c in shrinks)
    assert {(c.topic, c.partition) for c in shrinks} == {(p.topic, p.index) for p in holding}
    moved = {(c.topic, c.partition): c for c in shrinks if c.leader_before == b}
    assert set(moved) == led
    for c in moved.values():
        assert c.leader_after == c.isr_after[0] != b

    obs = list(observations(records))
    during = [o for o in obs if START_MS + pause.at_ms <= o.t_ms < START_MS + pause.until_ms]
    assert during and all(o.leo is None for o in during if o.broker_id == b)
    assert all(o.leader_leo is None for o in during if o.leader_id == b)
    after = [o for o in obs if o.t_ms > expired]
    for o in after:
        if (o.topic, o.partition) in moved:
            assert o.leader_id == moved[(o.topic, o.partition)].leader_after

    expands = [c for c in sim.truth if c.change == "expand"]
    assert {(c.topic, c.partition) for c in expands} == {(p.topic, p.index) for p in holding}
    assert all(c.brokers == (b,) and c.t_ms > START_MS + pause.until_ms for c in expands)


def test_bootstrapping_follower_rejoins_exactly_when_it_reaches_the_high_watermark():
    sim, records = run("bootstrapping-follower", 40, seed=1, mode="fetch")
    (boot,) = sim.scenario.faults
    assert isinstance(boot, FollowerBootstrap)
    f = boot.follower
    followed = {(p.topic, p.index) for p in sim.engine.partitions if f in p.replicas and p.replicas[0] != f}
    expands = {(c.topic, c.partition): c for c in sim.truth if c.change == "expand"}
    assert set(expands) == followed
    assert [c for c in sim.truth if c.change == "shrink"] == []

    obs = [o for o in observations(records) if o.broker_id == f]
    for (topic, partition), c in expands.items():
        mine = [o for o in obs if (o.topic, o.partition) == (topic, partition)]
        assert mine[0].leader_leo - mine[0].leo >= boot.backlog  # starts far behind
        assert f not in mine[0].isr
        first_at_hw = next(o for o in mine if o.leo >= o.hw)
        assert first_at_hw.t_ms == c.t_ms
        assert c.leo is not None and c.leo >= c.hw
        before = [o for o in mine if o.t_ms < c.t_ms]
        assert all(o.leo < o.hw and f not in o.isr for o in before)
        assert c.t_ms - START_MS > 5_000  # copying the backlog takes a while


FOUR = ProduceProfile("four-message bursts", rate_per_s=0, burst_every_ms=50, burst_messages=4)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_legacy_rule_thrashes_on_four_message_bursts_where_kip16_refined_does_not(seed):
    common = dict(seed=seed, lag_time_max_ms=2000, lag_max_messages=4, profile=FOUR)
    legacy, _ = run("steady", 120, rule=Rule.LEGACY_MESSAGES, **common)
    refined, _ = run("steady", 120, rule=Rule.KIP16_REFINED, **common)

    shrunk = [(c.topic, c.partition, b) for c in legacy.truth if c.change == "shrink" for b in c.brokers]
    back = [(c.topic, c.partition, b) for c in legacy.truth if c.change == "expand" for b in c.brokers]
    assert len(shrunk) >= 10
    assert all(c.cause == "leader-check" for c in legacy.truth if c.change == "shrink")
    # Thrash: each healthy follower drops out and comes straight back, again and again.
    assert sorted(shrunk) == sorted(back) or len(shrunk) - len(back) <= len(legacy.engine.partitions) * 2
    assert max(shrunk.count(k) for k in set(shrunk)) >= 2
    assert refined.truth == []


def _shrink_tick_gcd(truth) -> dict[int, int]:
    """Per leader, the gcd of the gaps between its shrinks: its ISR check period."""
    times: dict[int, set[int]] = {}
    for c in truth:
        if c.change == "shrink" and c.cause == "leader-check":
            times.setdefault(c.leader_before, set()).add(c.t_ms)
    out = {}
    for leader, ts in times.items():
        ordered = sorted(ts)
        if len(ordered) >= 3:
            out[leader] = math.gcd(*(b - a for a, b in itertools.pairwise(ordered)))
    return out


def test_leaders_check_every_check_period_of_their_rule():
    legacy, _ = run(
        "steady", 120, seed=1, rule=Rule.LEGACY_MESSAGES, lag_time_max_ms=2000, lag_max_messages=4, profile=FOUR
    )
    gcds = _shrink_tick_gcd(legacy.truth)
    assert gcds and set(gcds.values()) == {check_period_ms(legacy.rule)} == {2000}

    # kip16-refined checks twice per replica.lag.time.max.ms: stall one fetcher again and again.
    follower, leader = 3, 1
    starts = (5000, 15700, 26300, 37900, 48200, 60100, 71500, 83000)  # uneven gaps
    stalls = tuple(FetcherStall(follower, leader, at, at + 6000) for at in starts)
    scenario = Scenario("stalls", "repeated stalls", STEADY, stalls)
    refined, _ = run(scenario, 100, seed=1, lag_time_max_ms=2000)
    shrinks = [c for c in refined.truth if c.change == "shrink"]
    assert len({c.t_ms for c in shrinks}) == len(stalls)
    assert _shrink_tick_gcd(refined.truth) == {leader: check_period_ms(refined.rule)} == {leader: 1000}


def test_a_benchmark_size_cluster_stays_healthy():
    """Bench loads: the produce rate is scaled so no fetcher is overloaded; nothing shrinks."""
    sim, records = run("burst", 45, seed=1, brokers=6, topics=4, partitions=30)
    assert sim.scenario.profile.burst_messages < BURST.burst_messages  # scaled to the bigger cluster
    assert sim.truth == []
    replay = RuleReplay().feed(observations(records))
    assert len(replay.max_age_ms) == 4 * 30 * 2
    assert max(replay.max_age_ms.values()) / LAG < 0.3


def _lag_alerts(obs: list[tuple[str, dict]]) -> set[tuple[str, int]]:
    """(alert name, broker) of every Imminent and OutOfSync alert the reference raises."""
    th = Thresholds()
    wanted = {AlertName.IMMINENT.value, AlertName.OUT_OF_SYNC.value}
    return {
        (a.name.value, s.broker_id)
        for _, s in walk(obs, CFG, th, LAG // 2)
        for a in replica_alerts(s, th)
        if a.name.value in wanted
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_leader_epoch_bump_keeps_the_slow_follower_and_so_does_the_rule_only_with_the_epoch(seed):
    """KRaft before metadata.version 3.6-IV0: broker 3 stops fetching and its leader drops
    it; that ISR change bumps the epoch, which restarts slow broker 2's clock, so the broker
    keeps broker 2. The reference, given the epoch, alerts for broker 3 alone; with the epoch
    left out of the telemetry (as from a collector that cannot read it) broker 2 gets a
    false Imminent and OutOfSync."""
    sim, records = run("leader-epoch-bump", 68, seed=seed)
    stall = next(f for f in sim.scenario.faults if isinstance(f, AtLeaderCheck)).faults[0]
    assert isinstance(stall, FetcherStall) and (stall.follower, stall.leader) == (3, 1)
    victims = fault_partitions(sim, 3, 1)
    shrinks = [c for c in sim.truth if c.change == "shrink"]
    assert {(c.topic, c.partition, b) for c in shrinks for b in c.brokers} == victims
    assert all(c.cause == "leader-check" and c.leader_before == c.leader_after == 1 for c in shrinks)
    # at the leader's check the scenario aims at: its first at or after 21 s, 11 s after the stall
    aimed = sim.engine.next_check_ms(1, FAULT_START_MS + EPOCH_STOP_BEFORE_MS)
    assert {c.t_ms - START_MS for c in shrinks} == {aimed}
    assert (aimed - sim.engine.check_phase[1]) % check_period_ms(CFG) == 0

    obs = [("sim", dataclasses.asdict(o)) for o in observations(records)]
    epochs = {(o["topic"], o["partition"]): set() for _, o in obs}
    for _, o in obs:
        epochs[(o["topic"], o["partition"])].add(o["leader_epoch"])
    # each of broker 1's partitions: epoch 0, bumped by the shrink and by the expand after
    assert all(epochs[(t, p)] == {0, 1, 2} for t, p, _ in victims)
    assert _lag_alerts(obs) == {("KafkaReplicaIsrShrinkImminent", 3), ("KafkaReplicaOutOfSync", 3)}
    without = [(c, {**o, "leader_epoch": None}) for c, o in obs]
    assert {b for _, b in _lag_alerts(without)} == {2, 3}
    # and it is the bump that keeps broker 2: the same faults on a cluster that does not bump
    plain = [f for f in sim.scenario.faults if not isinstance(f, EpochPerIsrChange)]
    unbumped, _ = run(dataclasses.replace(sim.scenario, faults=tuple(plain)), 68, seed=seed)
    assert {b for c in unbumped.truth if c.change == "shrink" for b in c.brokers} == {2, 3}
