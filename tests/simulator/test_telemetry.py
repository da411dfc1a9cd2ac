"""The simulator's telemetry: valid against the schema, round-trips, deterministic, chained."""

from __future__ import annotations

import json

import jsonschema
import pytest

from isrwatch.telemetry import decode_record, encode_record, json_schema
from simulator import SCENARIOS, ClusterSpec, Simulation
from tests.simulator.replay import START_MS, key, observations, run

VALIDATOR = jsonschema.Draft202012Validator(json_schema())


@pytest.mark.parametrize("mode, duration", [("poll", 45), ("fetch", 5)])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_record_validates_and_round_trips(scenario, mode, duration):
    sim, records = run(scenario, duration, mode=mode, seed=2)
    assert records
    for r in records:
        VALIDATOR.validate(json.loads(r))
        decoded = decode_record(r)
        assert decoded.cluster == "sim" and decoded.source.startswith("simulator")
        assert encode_record(decoded) == r  # the fast encoder writes what encode_record writes
    assert sum(len(decode_record(r).observations) for r in records) == sim.observations


def test_poll_rounds_hold_one_observation_per_follower_replica_each():
    sim = Simulation("steady", start_ms=START_MS, brokers=5, topics=3, partitions=7)
    followers = sum(len(p.replicas) - 1 for p in sim.engine.partitions)
    assert followers == 3 * 7 * 2
    for i, (t, batch) in enumerate(sim.rounds(3)):
        assert t == START_MS + i * 1000
        obs = list(observations(batch))
        assert len(obs) == followers
        assert {o.t_ms for o in obs} == {t}
        assert len({key(o) for o in obs}) == followers


def test_prev_fields_chain_each_replica_to_its_previous_observation():
    _, records = run("slow-follower", 30)
    last = {}
    for o in observations(records):
        k = key(o)
        if k in last:
            prev = last[k]
            assert (o.prev_t_ms, o.prev_leo, o.prev_leader_leo) == (prev.t_ms, prev.leo, prev.leader_leo)
        else:
            assert (o.prev_t_ms, o.prev_leo, o.prev_leader_leo) == (None, None, None)
        last[k] = o
        assert o.lag_time_max_ms == 10_000 and o.min_isr == 2
        assert o.hw is not None and o.leo is not None and o.leo <= o.leader_leo


def test_fetch_mode_prev_fields_are_the_leaders_previous_fetch():
    _, records = run("burst", 25, mode="fetch")
    last = {}
    for o in observations(records):
        k = key(o)
        if k in last:
            assert o.prev_t_ms == last[k].t_ms <= o.t_ms
            assert o.prev_leo == last[k].leo <= o.leo
            assert o.prev_leader_leo == last[k].leader_leo
        last[k] = o
    assert len(last) == 12


def test_isr_changes_ride_in_the_round_after_they_happen():
    sim, records = run("stuck-follower", 60)
    sent = [(decode_record(r).sent_ms, c) for r in records for c in decode_record(r).isr_changes]
    truth = [c for c in sim.truth if c.isr_before != c.isr_after]
    assert [(c.t_ms, c.topic, c.partition, c.isr_before, c.isr_after) for _, c in sent] == [
        (c.t_ms, c.topic, c.partition, c.isr_before, c.isr_after) for c in truth
    ]
    assert all(c.t_ms <= sent_ms < c.t_ms + sim.interval_ms for sent_ms, c in sent)


def test_large_rounds_are_split_into_records_with_the_changes_in_the_first():
    sim = Simulation("broker-pause", start_ms=START_MS, partitions=20, max_observations_per_record=7)
    for t, batch in sim.rounds(20):
        decoded = [decode_record(r) for r in batch]
        assert all(len(d.observations) <= 7 for d in decoded)
        assert sum(len(d.observations) for d in decoded) == 2 * 20 * 2
        assert all(not d.isr_changes for d in decoded[1:])
        if t == START_MS + 16_000:
            assert len(decoded[0].isr_changes) == 2 * 20  # the controller's removals, at 16 s


@pytest.mark.parametrize("mode", ["poll", "fetch"])
def test_a_seed_determines_the_run(mode):
    a, ra = run("broker-pause", 50, seed=11, mode=mode)
    b, rb = run("broker-pause", 50, seed=11, mode=mode)
    c, rc = run("broker-pause", 50, seed=12, mode=mode)
    assert ra == rb and a.truth == b.truth
    assert ra != rc


def test_time_starts_at_the_wall_clock_by_default():
    from simulator.run import now_ms

    before = now_ms()
    sim = Simulation("steady")
    t, _ = sim.step()
    assert before <= sim.start_ms == t <= now_ms()


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="scenario='nope' is not one of: steady"):
        Simulation("nope")
    with pytest.raises(ValueError, match="mode='push'"):
        Simulation("steady", mode="push")
    with pytest.raises(ValueError, match="replication_factor=3 exceeds brokers=2"):
        ClusterSpec(brokers=2)
    assert Simulation("steady", brokers=2).spec.replication_factor == 2
    with pytest.raises(ValueError, match="rule='kip99'"):
        Simulation("steady", rule="kip99")
