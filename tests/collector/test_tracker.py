"""ReplicaTracker, batching and config translation (no Kafka needed)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from collector.probe import PartitionState, Snapshot
from collector.publisher import batch_records
from collector.tracker import ReplicaTracker
from isrwatch.clientconfig import broker_version, kafka_python_config
from isrwatch.episodes import state_changes
from isrwatch.exceptions import ConfigError
from isrwatch.kafkawire import kept_replicas
from isrwatch.rule import RuleConfig
from isrwatch.status import Thresholds
from isrwatch.telemetry import TelemetryRecord, decode_record, encode_record, json_schema

P0 = PartitionState("orders", 0, leader=1, replicas=(1, 2, 3), isr=(1, 2, 3))


def snap(t_ms, leo, isr=(1, 2, 3), unreachable=(), fresh=True):
    ps = PartitionState("orders", 0, 1, (1, 2, 3), tuple(isr))
    return Snapshot(
        t_ms=t_ms,
        brokers={1: "a:1", 2: "b:1", 3: "c:1"},
        partitions=[ps],
        leo={(b, "orders", 0): v for b, v in leo.items()},
        hw={("orders", 0): min(leo.values())},
        unreachable=set(unreachable),
        metadata_fresh=fresh,
    )


def test_one_observation_per_follower_with_previous_round():
    tr = ReplicaTracker(lag_time_max_ms=3000)
    first = tr.observe(snap(1000, {1: 10, 2: 10, 3: 8})).observations
    assert {(o.broker_id, o.leo, o.leader_leo) for o in first} == {(2, 10, 10), (3, 8, 10)}
    assert all(o.prev_t_ms is None and o.lag_time_max_ms == 3000 for o in first)
    second = {o.broker_id: o for o in tr.observe(snap(2000, {1: 20, 2: 20, 3: 9})).observations}
    assert (second[3].prev_t_ms, second[3].prev_leo, second[3].prev_leader_leo) == (1000, 8, 10)
    assert (second[3].leo, second[3].leader_leo, second[3].hw) == (9, 20, 9)
    assert second[2].leader_id == 1 and second[2].replicas == (1, 2, 3)


def test_the_leader_epoch_goes_into_the_observations_where_the_metadata_gives_it():
    """Metadata v7+ gives the epoch (telemetry ``leader_epoch``); -1 (Kafka before 2.1, the
    JMX path) is written as unknown, left out of the record."""
    tr = ReplicaTracker()
    unknown = tr.observe(snap(1000, {1: 10, 2: 10, 3: 8})).observations
    assert {o.leader_epoch for o in unknown} == {None}
    assert b"leader_epoch" not in encode_record(TelemetryRecord("c", "fetch", 1, tuple(unknown)))
    s = snap(2000, {1: 20, 2: 20, 3: 9})
    s.partitions = [PartitionState("orders", 0, 1, (1, 2, 3), (1, 2, 3), leader_epoch=7)]
    known = tr.observe(s).observations
    assert {o.leader_epoch for o in known} == {7}
    data = encode_record(TelemetryRecord("c", "fetch", 2, tuple(known)))
    jsonschema.validate(json.loads(data), json_schema())
    assert decode_record(data).observations == tuple(known)


def test_unreachable_broker_gives_none_and_leader_down_gives_none_leader_leo():
    tr = ReplicaTracker()
    obs = {o.broker_id: o for o in tr.observe(snap(1000, {1: 10, 2: 10}, unreachable=[3])).observations}
    assert obs[3].leo is None and obs[2].leo == 10
    obs = {o.broker_id: o for o in tr.observe(snap(2000, {2: 10, 3: 10}, unreachable=[1])).observations}
    assert obs[2].leader_leo is None and obs[3].prev_leo is None


def test_rounds_without_the_leader_keep_the_previous_observation_from_before_its_silence():
    tr = ReplicaTracker()
    tr.observe(snap(1000, {1: 10, 2: 10, 3: 10}))
    silent = tr.observe(snap(2000, {2: 10, 3: 10}, unreachable=[1])).observations
    assert all(o.leader_leo is None and o.prev_t_ms == 1000 for o in silent)
    assert tr.observe(snap(2000, {2: 10, 3: 10}, unreachable=[1])).observations == []  # nothing new: not repeated
    tr.observe(snap(3000, {2: 10, 3: 10}, unreachable=[1]))
    back = {o.broker_id: o for o in tr.observe(snap(4000, {1: 40, 2: 10, 3: 10})).observations}
    assert (back[3].prev_t_ms, back[3].prev_leo, back[3].prev_leader_leo) == (1000, 10, 10)
    after = {o.broker_id: o for o in tr.observe(snap(5000, {1: 40, 2: 40, 3: 40})).observations}
    assert (after[3].prev_t_ms, after[3].prev_leader_leo) == (4000, 40)


def test_a_leader_log_gone_backwards_leaves_no_previous_observation():
    tr = ReplicaTracker()
    tr.observe(snap(1000, {1: 50, 2: 50, 3: 48}))
    obs = {o.broker_id: o for o in tr.observe(snap(2000, {1: 45, 2: 45, 3: 45})).observations}
    assert obs[3].prev_t_ms is None and obs[3].prev_leo is None and obs[3].prev_leader_leo is None
    obs = {o.broker_id: o for o in tr.observe(snap(3000, {1: 47, 2: 47, 3: 46})).observations}
    assert (obs[3].prev_t_ms, obs[3].prev_leader_leo) == (2000, 45)


def test_a_leader_silent_longer_than_the_lag_window_does_not_age_its_followers():
    """The leader of a partition paused 33 s (lag window 20 s) while its followers answer; at
    SIGCONT its producers' backlog lands before the followers' next fetch, so the first round
    with the leader shows them behind, the next caught up. Found by
    tests/e2e/test_hung_telemetry_broker.py: the job paged Nearing, Imminent and OutOfSync for
    a follower of the paused leader and resolved them in the same batch (no shrink in the
    leaders' logs), because the silent rounds had replaced the previous observation with one
    that had no leader LEO."""
    tr, rows = ReplicaTracker(), []
    for t in range(0, 5_000, 500):
        rows += tr.observe(snap(t, {1: t, 2: t, 3: t})).observations
    for t in range(5_000, 38_000, 500):  # the leader is silent; the followers answer, stuck at its LEO
        rows += tr.observe(snap(t, {2: 4_500, 3: 4_500}, unreachable=[1])).observations
    rows += tr.observe(snap(38_000, {1: 4_800, 2: 4_500, 3: 4_500})).observations
    rows += tr.observe(snap(38_500, {1: 4_850, 2: 4_850, 3: 4_850})).observations
    cfg = RuleConfig(lag_time_max_ms=20_000)
    changes = state_changes([("c", o.__dict__) for o in rows], cfg, Thresholds(), 10_000)
    assert changes == [], [(c.key, c.status.state, c.status.eval_ms) for c in changes]


def _silence(tr, follower_leo, back):
    """Rounds every 500 ms: the leader (broker 1) answering at first, followers a batch
    behind in its last round, then silent 33 s (lag window 20 s) while the followers
    answer stuck at ``follower_leo``, then answering again: ``back`` is the followers'
    LEOs, per round from then on (the leader at 4_800 + 50 a round)."""
    rows = []
    for t in range(0, 4_500, 500):
        rows += tr.observe(snap(t, {1: t, 2: t, 3: t})).observations
    rows += tr.observe(snap(4_500, {1: 4_500, 2: 4_490, 3: 4_490})).observations
    for t in range(5_000, 38_000, 500):
        rows += tr.observe(snap(t, {2: follower_leo, 3: follower_leo}, unreachable=[1])).observations
    for i, leo in enumerate(back):
        rows += tr.observe(snap(38_000 + 500 * i, {1: 4_800 + 50 * i, 2: leo, 3: leo})).observations
    return rows


def _changes(rows):
    return state_changes([("c", o.__dict__) for o in rows], RuleConfig(lag_time_max_ms=20_000), Thresholds(), 10_000)


def test_a_follower_a_batch_behind_when_its_leader_paused_is_not_aged_by_the_silence():
    """As above, but the last round before the pause showed the followers a batch behind the
    leader (their fetch of it still in flight), and the first round with the leader back shows
    them there still: their fetch waiting at the leader is answered after its backlog. The
    leader counts them caught up the instant it answers that fetch; the next round shows them
    at its LEO. Found by tests/e2e/test_two_clusters.py in CI (2026-12-06): Nearing, Imminent
    and OutOfSync for a follower of the paused leader, no shrink in the leaders' logs. That
    first round is left out; without that, the job paged for both followers."""
    tr = ReplicaTracker()
    rows = _silence(tr, 4_490, [])
    assert tr.observe(snap(38_000, {1: 4_800, 2: 4_490, 3: 4_490})).held == 2  # both followers, counted
    for i, leo in enumerate([4_850, 4_900], start=1):
        rows += tr.observe(snap(38_000 + 500 * i, {1: 4_800 + 50 * i, 2: leo, 3: leo})).observations
    back = [o for o in rows if o.t_ms >= 38_000]
    assert {(o.t_ms, o.broker_id) for o in back} == {(38_500, 2), (38_500, 3), (39_000, 2), (39_000, 3)}
    held = next(o for o in back if o.t_ms == 38_500)
    assert (held.prev_t_ms, held.prev_leo, held.prev_leader_leo) == (4_500, 4_490, 4_500)
    assert _changes(rows) == [], [(c.key, c.status.state, c.status.eval_ms) for c in _changes(rows)]


def test_a_follower_really_stuck_after_its_leader_silence_is_observed_one_round_later():
    """The same silence, but the followers stay below the leader's LEO of before it: only the
    first round back is left out, the next goes out and the job finds them out of sync."""
    tr = ReplicaTracker()
    rows = _silence(tr, 4_490, [4_490, 4_490, 4_490])
    assert {o.t_ms for o in rows if o.t_ms >= 38_000} == {38_500, 39_000}
    states = {(c.key[-1], c.status.state.value) for c in _changes(rows)}
    assert {(2, "out_of_sync"), (3, "out_of_sync")} <= states, states


def test_a_leader_answering_every_other_round_holds_back_every_other_answered_round_at_most():
    """A follower stuck below its leader's LEO, the leader answering every other round: the
    hold is once in a row, so half of the leader's answered rounds still observe it."""
    tr = ReplicaTracker()
    tr.observe(snap(0, {1: 100, 2: 90, 3: 90}))
    answered, silent = [], []
    for i in range(1, 12):
        if i % 2 == 0:
            result = tr.observe(snap(500 * i, {1: 100 + i, 2: 90, 3: 90}))
            answered.append(len(result.observations))
            assert result.held == 2 - len(result.observations), "every follower left out is counted"
        else:
            silent.append(len(tr.observe(snap(500 * i, {2: 90, 3: 90}, unreachable=[1])).observations))
    assert answered == [0, 2, 0, 2, 0], answered
    assert silent == [2] * 6, silent


def test_isr_changes_only_from_fresh_metadata_and_set_based():
    tr = ReplicaTracker()
    assert tr.observe(snap(1000, {1: 1, 2: 1, 3: 1})).isr_changes == []
    assert tr.observe(snap(2000, {1: 1, 2: 1, 3: 1}, isr=(1, 3, 2))).isr_changes == []
    assert tr.observe(snap(3000, {1: 1, 2: 1, 3: 1}, isr=(1, 2), fresh=False)).isr_changes == []
    changes = tr.observe(snap(4000, {1: 1, 2: 1, 3: 1}, isr=(1, 2))).isr_changes
    assert [(c.t_ms, c.isr_before, c.isr_after) for c in changes] == [(4000, (1, 3, 2), (1, 2))]


def test_round_without_new_answers_repeats_nothing():
    tr = ReplicaTracker()
    tr.observe(snap(1000, {1: 1, 2: 1, 3: 1}))
    assert tr.observe(snap(1000, {1: 1, 2: 1, 3: 1})).observations == []


def test_batches_are_valid_telemetry_and_keep_isr_changes_once():
    tr = ReplicaTracker(lag_time_max_ms=3000)
    tr.observe(snap(1000, {1: 5, 2: 5, 3: 5}))
    result = tr.observe(snap(2000, {1: 9, 2: 9, 3: 5}, isr=(1, 2), unreachable=[]))
    records = batch_records("c1", result.observations, result.isr_changes, max_observations=1, sent_ms=2100)
    assert len(records) == 2
    assert [len(r.isr_changes) for r in records] == [1, 0]
    for r in records:
        body = encode_record(r)
        jsonschema.validate(__import__("json").loads(body), json_schema())
        assert decode_record(body) == r
    assert batch_records("c1", [], [], 10) == []


@pytest.mark.parametrize(
    ("text", "expected"), [("0.9.0.1", (0, 9)), ("0.10.2.1", (0, 10, 2)), ("2.8.1", (2, 8)), ("3", (3, 0))]
)
def test_broker_version(text, expected):
    assert broker_version(text) == expected


def test_kafka_python_config_translates_security_and_compat():
    cfg = kafka_python_config(
        "h1:9093,h2:9093",
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "scram-sha-512",
            "sasl.username": "watcher",
            "sasl.password": "s3cret",
            "ssl.ca.location": "/etc/ca.pem",
            "api.version.request": "false",
            "broker.version.fallback": "0.9.0.1",
            "linger.ms": "5",
        },
    )
    assert cfg["bootstrap_servers"] == ["h1:9093", "h2:9093"]
    assert (cfg["security_protocol"], cfg["sasl_mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (cfg["sasl_plain_username"], cfg["sasl_plain_password"], cfg["ssl_cafile"]) == (
        "watcher",
        "s3cret",
        "/etc/ca.pem",
    )
    assert cfg["api_version"] == (0, 9)
    assert "linger_ms" not in cfg and "api_version" not in kafka_python_config("h:1", {})


def test_kafka_python_config_rejects_bad_numbers():
    with pytest.raises(ConfigError, match="request.timeout.ms"):
        kafka_python_config("h:1", {"request.timeout.ms": "soon"})
    with pytest.raises(ConfigError, match="broker.version.fallback"):
        kafka_python_config("h:1", {"api.version.request": "false", "broker.version.fallback": "new"})


# -- a replica a Kafka 0.9 metadata answer leaves out (the rule: tests/isrwatch/test_kafkawire.py) --

BEFORE = (1, 2, 3)


def test_a_kept_follower_is_observed_silent_and_out_of_the_isr():
    """What the tracker makes of a kept replica: an observation each round, no LEO, the leader's
    LEO and the ISR without it (the job: out of sync, stalled while the leader moves)."""
    tr = ReplicaTracker(lag_time_max_ms=10_000)
    tr.observe(snap(1000, {1: 10, 2: 10, 3: 10}))
    kept = PartitionState("orders", 0, 1, kept_replicas(BEFORE, (1, 3), 9, {1, 3}), (1, 3))
    gone = Snapshot(
        t_ms=2000, brokers={1: "a:1", 3: "c:1"}, partitions=[kept], leo={(1, "orders", 0): 20, (3, "orders", 0): 20}
    )
    by_broker = {o.broker_id: o for o in tr.observe(gone).observations}
    assert sorted(by_broker) == [2, 3]
    assert (by_broker[2].leo, by_broker[2].leader_leo, by_broker[2].isr) == (None, 20, (1, 3))
    assert by_broker[2].prev_t_ms == 1000  # its last answer is still what it is compared against


def _layout(t_ms, partitions, fresh=True):
    """A round whose metadata lists ``partitions`` (topic, partition, leader, replicas), every replica answering."""
    states = [PartitionState(t, p, leader, replicas, replicas) for t, p, leader, replicas in partitions]
    leo = {(b, ps.topic, ps.partition): 10 for ps in states for b in ps.replicas}
    return Snapshot(t_ms=t_ms, brokers={1: "a:1", 2: "b:1", 3: "c:1", 4: "d:1"}, partitions=states, leo=leo,
                    metadata_fresh=fresh)  # fmt: skip


def _gone_times(tr, rounds):
    """Round by round, the replicas found gone: [(t_ms, {(topic, partition, broker)})]."""
    out = []
    for t_ms, partitions, fresh in rounds:
        gone = tr.observe(_layout(t_ms, partitions, fresh)).gone
        assert all(g.t_ms == t_ms for g in gone)
        out.append((t_ms, {(g.topic, g.partition, g.broker_id) for g in gone}))
    return [(t, g) for t, g in out if g]


def test_a_deleted_topic_and_a_moved_replica_are_said_gone_once_after_rounds_and_time():
    both = [("orders", 0, 1, (1, 2, 3)), ("old", 0, 2, (2, 3))]
    moved = [("orders", 0, 1, (1, 2, 4))]  # "old" deleted; orders-0 moved from broker 3 to 4
    tr = ReplicaTracker()
    rounds = [(0, both, True)] + [(1000 * i, moved, True) for i in range(1, 10)]
    # missing from the round at 1 s: gone at the first round both GONE_AFTER_ROUNDS rounds
    # and GONE_AFTER_MS after it (6 s), once
    assert _gone_times(tr, rounds) == [(6000, {("old", 0, 2), ("old", 0, 3), ("orders", 0, 3)})]


def test_gone_needs_consecutive_rounds_of_fresh_metadata_that_lists_partitions():
    one = [("orders", 0, 1, (1, 2, 3))]
    tr = ReplicaTracker()
    rounds = [(0, one, True)]
    rounds += [(1000 * i, [], True) for i in range(1, 8)]  # an answer with no partitions: says nothing
    rounds += [(1000 * i, [("other", 0, 1, (1, 2))], False) for i in range(8, 16)]  # stale metadata: nothing
    assert _gone_times(tr, rounds) == []
    # left out for 4 s, listed again, left out again: the count starts over
    rounds = [(16000 + 1000 * i, [("other", 0, 1, (1, 2))], True) for i in range(5)]
    rounds += [(21000, one, True)]
    rounds += [(22000 + 1000 * i, [("other", 0, 1, (1, 2))], True) for i in range(7)]
    assert _gone_times(tr, rounds) == [(27000, {("orders", 0, 1), ("orders", 0, 2), ("orders", 0, 3)})]


def test_a_partition_without_a_leader_is_not_gone():
    tr = ReplicaTracker()
    rounds = [(0, [("orders", 0, 1, (1, 2, 3))], True)]
    rounds += [(1000 * i, [("orders", 0, -1, (1, 2, 3))], True) for i in range(1, 12)]
    assert _gone_times(tr, rounds) == []


def test_gone_replicas_go_in_the_first_record_of_the_round_and_not_in_version_1():
    from isrwatch.telemetry import GoneReplica

    g = (GoneReplica(5, "old", 0, 2),)
    obs = ReplicaTracker().observe(snap(1000, {1: 10, 2: 10, 3: 8})).observations
    records = batch_records("c", obs, [], 1, gone=g)
    assert [r.gone for r in records] == [g, ()]
    only = batch_records("c", [], [], 10, gone=g)
    assert len(only) == 1 and decode_record(encode_record(only[0])).gone == g
    jsonschema.validate(__import__("json").loads(encode_record(only[0])), json_schema())
    assert batch_records("c", [], [], 10, gone=g, version=1) == []


def test_a_follower_left_the_only_replica_of_its_partition_is_said_gone_at_once():
    # orders-0: broker 2 follows; then the topic is created again (or reassigned) with broker 2
    # as its only replica. No follower's observation names it leader, so the tracker says it
    # gone as a follower, in that round, once. Broker 1 (and 3) missing: gone after the wait.
    tr = ReplicaTracker()
    rounds = [(0, [("orders", 0, 1, (1, 2, 3))], True)]
    rounds += [(1000 * i, [("orders", 0, 2, (2,))], True) for i in range(1, 8)]
    assert _gone_times(tr, rounds) == [(1000, {("orders", 0, 2)}), (6000, {("orders", 0, 1), ("orders", 0, 3)})]


def test_a_leader_that_was_never_a_follower_or_stale_metadata_says_nothing_of_a_sole_leader():
    tr = ReplicaTracker()
    # broker 1 led orders-0 with followers, then is its only replica: it was never a follower
    rounds = [(0, [("orders", 0, 1, (1, 2))], True), (1000, [("orders", 0, 1, (1,))], True)]
    assert _gone_times(tr, rounds) == []
    # stale metadata showing broker 2 the only replica says nothing; a follower elected leader
    # with other followers left is named by their observations (the job's rule), not said gone
    tr = ReplicaTracker()
    rounds = [(0, [("orders", 0, 1, (1, 2, 3))], True), (1000, [("orders", 0, 2, (2,))], False)]
    rounds += [(2000, [("orders", 0, 2, (1, 2, 3))], True)]
    assert _gone_times(tr, rounds) == []


def test_a_topic_created_again_with_one_replica_on_a_former_follower_says_it_gone():
    # deleted (missing from two rounds of fresh metadata, short of the gone wait), then created
    # again with broker 2, a follower before, its only replica: gone when that shows
    other = ("other", 0, 1, (1, 3))
    tr = ReplicaTracker()
    rounds = [(0, [("orders", 0, 1, (1, 2, 3)), other], True)]
    rounds += [(1000 * i, [other], True) for i in (1, 2)]
    rounds += [(1000 * i, [("orders", 0, 2, (2,)), other], True) for i in range(3, 9)]
    assert _gone_times(tr, rounds) == [(3000, {("orders", 0, 2)}), (6000, {("orders", 0, 1), ("orders", 0, 3)})]
