"""bench.load writes valid telemetry: the documented schema, the counts asked for,
and slow followers whose lag the rule sees grow."""

from __future__ import annotations

import json

import jsonschema

from bench.load import Fleet
from isrwatch.rule import Rule, caught_up_time
from isrwatch.telemetry import decode_record, json_schema


def test_rounds_follow_the_schema_and_cover_every_replica_once() -> None:
    fleet = Fleet(1203, per_record=500)
    records = fleet.round(3, 1_700_000_003_000, slow={5: 2})
    assert len(records) == fleet.records_per_round() == 3
    schema = json_schema(1)  # bench.load writes version 1, which the job still reads
    seen = []
    for rec in records:
        jsonschema.validate(json.loads(rec), schema)
        seen += [(o.topic, o.partition, o.broker_id) for o in decode_record(rec).observations]
    assert sorted(seen) == sorted(fleet.keys)
    assert len(set(seen)) == 1203


def test_follower_is_never_its_own_leader() -> None:
    fleet = Fleet(40)
    for rec in fleet.round(0, 1_700_000_000_000):
        for o in decode_record(rec).observations:
            assert o.broker_id != o.leader_id
            assert o.prev_t_ms is None and o.prev_leo is None


def test_slow_follower_progresses_but_stops_catching_up() -> None:
    fleet = Fleet(10)
    slow = {3: 5}
    lcu = None
    for r in range(12):
        leo, lleo, prev_leo, prev_lleo = fleet.values(3, r, slow)
        if r > 0:
            assert prev_leo is not None and leo > prev_leo  # progress: never stalled
        t = 1000 * r
        cu = caught_up_time(Rule.KIP16_REFINED, t, leo, lleo, t - 1000 if r else None, prev_lleo)
        if cu is not None:
            lcu = max(lcu or cu, cu)
    assert lcu == 5000  # caught up to the previous fetch's leader LEO one round after slowing, never since
    healthy = [fleet.values(4, r, slow) for r in range(12)]
    assert all(leo == lleo for leo, lleo, _, _ in healthy)


def test_encoded_values_match_values() -> None:
    fleet = Fleet(6)
    slow = {2: 1}
    obs = decode_record(fleet.round(4, 4000, slow)[0]).observations
    for i, o in enumerate(obs):
        leo, lleo, prev_leo, prev_lleo = fleet.values(i, 4, slow)
        assert (o.leo, o.leader_leo, o.prev_leo, o.prev_leader_leo, o.prev_t_ms) == (
            leo,
            lleo,
            prev_leo,
            prev_lleo,
            3000,
        )


def test_slices_of_a_round_are_the_round():
    fleet = Fleet(1003, per_record=100, interval_ms=20_000)
    slow = {5: 1, 700: 2}

    def observations(records):
        return [o for x in records for o in json.loads(x)["observations"]]

    whole = observations(fleet.round(2, 1_000_000, slow))
    parts = [observations(fleet.round(2, 1_000_000, slow, lo=lo, hi=lo + 250)) for lo in range(0, 1003, 250)]
    assert [o for part in parts for o in part] == whole and len(whole) == 1003
    assert whole[5]["leo"] < whole[5]["leader_leo"] and whole[4]["leo"] == whole[4]["leader_leo"]
