"""Issue 3, done-when 1: a burst that healthy followers absorb within the window.

Real cluster, default fetch sizes, light steady load, then a burst of 50k
messages of 1 KB produced as fast as the client can. The followers copy it in
a few seconds, well inside ``replica.lag.time.max.ms``: the leader logs no
shrink, and the job raises no ``KafkaReplicaOutOfSync`` (nor anything
critical) while it watches for two lag windows after the burst.

Issue 15, the seeds' story on a real broker: the telemetry the collector recorded (the
telemetry topic) replayed with ``isrwatch replay`` under the message rule with the seeds'
``replica.lag.max.messages`` (4000) and under the time rules at the broker's own setting. The
broker logged no shrink; the time rules must say the same, and the message rule, which the
burst can put thousands of messages behind, drops and re-admits followers (flaps) when a
collector round catches them there: recorded at 4000, 1000 and 250 messages, not asserted
(it depends on how fast the machine replicates), beyond dropping no fewer at a lower limit.
"""

from __future__ import annotations

import time

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pipeline import COLLECT_INTERVAL_S, LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import replay_telemetry, write_result

pytestmark = pytest.mark.validation

BURST = 50_000
MESSAGE_BYTES = 1000
MESSAGE_LIMITS = (4000, 1000, 250)  # replica.lag.max.messages replayed: the seeds' 4000, and lower


def test_burst_absorbed_by_healthy_followers_raises_no_out_of_sync_and_no_shrink(kafka_cluster_factory, tmp_path):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    topic = "bursty"
    cluster.create_topic(topic, assignment=[[1, 2, 3], [2, 3, 1]])
    started = time.time()
    load = ProduceLoad(cluster, topic, 2, rate=50, size=MESSAGE_BYTES)
    with load, Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(4)
        burst_at = time.time()
        load.burst(BURST)  # returns once every message is acknowledged by its leader
        burst_s = time.time() - burst_at
        # Watch two lag windows: a shrink the burst caused would be logged by then.
        watch_until = time.time() + 2 * LAG_MS / 1000
        until("two lag windows after the burst", lambda: time.time() > watch_until, 4 * LAG_MS / 1000, pipe)
        batches_after = [b for b in pipe.batches()]
    shrinks = [c for c in cluster.isr_shrinks(started) if c.topic == topic]
    alerts = pipe.alerts()
    write_result(
        "burst",
        {
            "scenario": f"burst of {BURST} x {MESSAGE_BYTES} B over light load, healthy followers",
            "lag_time_max_ms": LAG_MS,
            "collector_interval_s": COLLECT_INTERVAL_S,
            "burst_s": burst_s,
            "shrinks": len(shrinks),
            "rows": [],
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in alerts],
        },
    )
    assert batches_after, "the job evaluated the replicas during the burst"
    assert not shrinks, f"the burst made the leader shrink the ISR: {shrinks}"
    bad = {AlertName.OUT_OF_SYNC.value, AlertName.IMMINENT.value, AlertName.STALLED.value}
    assert not [e.body for e in alerts if e.name in bad], "an absorbed burst raised a critical alert"

    rules = ["--rule", "legacy-messages", "--rule", "kip16", "--rule", "kip16-refined"]
    messages = ["--lag-max-messages", ",".join(map(str, MESSAGE_LIMITS))]
    replayed = replay_telemetry(cluster, pipe.telemetry_topic, "--lag-time-max-ms", str(LAG_MS), *rules, *messages)
    write_result("burst_replay", {"lag_time_max_ms": LAG_MS, "broker_shrinks": len(shrinks), "settings": replayed})
    got = {s["rule"]: s for s in replayed if s["rule"] != "legacy-messages"}
    for rule in ("kip16", "kip16-refined"):
        assert got[rule]["shrinks"] == len(shrinks) == 0, got[rule]  # the broker's own history
    # The message rule: how far behind a collector round catches the followers during a 1 s
    # burst depends on how fast the machine replicates (2-3 of 4 followers past 4,000 messages
    # in two runs, none in a third), so no count is asserted (a timed assertion); a lower
    # replica.lag.max.messages must drop followers at least as often as a higher one.
    legacy = {s["lag_max_messages"]: s["shrinks"] for s in replayed if s["rule"] == "legacy-messages"}
    assert sorted(legacy) == sorted(MESSAGE_LIMITS), legacy
    counts = [legacy[n] for n in sorted(MESSAGE_LIMITS, reverse=True)]
    assert counts == sorted(counts), f"fewer shrinks with a lower replica.lag.max.messages: {legacy}"
