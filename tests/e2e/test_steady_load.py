"""Issue 3, done-when 1 and 3: steady load for minutes, bad telemetry, and a burst.

Real cluster, collector and job, no fault: one cluster and one pipeline serve the three tests of
the module (nothing to restore between them), each on a topic of its own (two partitions,
RF 3, each broker leading or following each; the leader changes' three, pinned); isrwatch's own
topics placed by Kafka. In order: the steady run, the leaders moved under load
(tests/e2e/test_leader_changes.py, the scenario and its checks), the burst.

Steady load over two partitions for two minutes:

* the job prints no alert at all, and the leaders log no shrink;
* halfway, records that are not valid telemetry are written to the telemetry
  topic next to the collector's: each lands on the dead-letter topic with its
  reason, and the job keeps running (it goes on evaluating the replicas from
  the collector's telemetry, still without an alert).

A burst that healthy followers absorb within the window: default fetch sizes, light
steady load, then a burst of 50k messages of 1 KB produced as fast as the client can. The
followers copy it in a few seconds, well inside ``replica.lag.time.max.ms``: the leader
logs no shrink, and the job raises no ``KafkaReplicaOutOfSync`` (nor anything critical)
while it watches for two lag windows after the burst.

Issue 15, the seeds' story on a real broker: the telemetry the collector recorded (the
telemetry topic) replayed with ``isrwatch replay`` under the message rule with the seeds'
``replica.lag.max.messages`` (4000) and under the time rules at the broker's own setting. The
broker logged no shrink; the time rules must say the same, and the message rule, which the
burst can put thousands of messages behind, drops and re-admits followers (flaps) when a
collector round catches them there: recorded at 4000, 1000 and 250 messages, not asserted
(it depends on how fast the machine replicates), beyond dropping no fewer at a lower limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer

from isrwatch.alerts import AlertName
from tests.e2e.fuzz import BAD_RECORDS
from tests.e2e.kafka_io import ProduceLoad, read_topic
from tests.e2e.pipeline import COLLECT_INTERVAL_S, LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import replay_telemetry, write_result
from tests.e2e.test_leader_changes import TOPIC as LEADERS_TOPIC
from tests.e2e.test_leader_changes import leaders_moved_under_load

# (kafka: the module's cluster comes from its own fixture, not kafka_cluster_factory)
pytestmark = pytest.mark.kafka

STEADY_TOPIC, BURSTY_TOPIC = "steady", "bursty"
STEADY_S = 120
RATE = 200
BURST = 50_000
MESSAGE_BYTES = 1000
MESSAGE_LIMITS = (4000, 1000, 250)  # replica.lag.max.messages replayed: the seeds' 4000, and lower
WATCHED = 8  # follower replicas of the steady and bursty topics: two partitions, two followers each


@dataclass(frozen=True)
class Quiet:
    """The module's cluster and pipeline, and when they started."""

    cluster: Any
    pipe: Pipeline
    started: float


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quiet]:
    from localkafka import LocalKafka

    settings = {"replica.lag.time.max.ms": LAG_MS, "zookeeper.session.timeout.ms": ZK_SESSION_MS}
    with LocalKafka(brokers=3, broker_settings=settings) as cluster:
        for topic in (STEADY_TOPIC, BURSTY_TOPIC):
            cluster.create_topic(topic, assignment=[[1, 2, 3], [2, 3, 1]])
        started = time.time()
        # IsrwatchTelemetryStale also fires when the job's own batches fall 15 s behind, which a
        # loaded 2-core machine does (measured: Spark batches of 20+ s at load 12); these tests
        # are about replica alerts without a fault, so the staleness bound is widened here.
        stale = ["--stale-after-seconds", "60"]
        with Pipeline(cluster, tmp_path_factory.mktemp("quiet"), job_args=stale) as pipe:
            pipe.wait_watching(WATCHED)
            yield Quiet(cluster, pipe, started)


def read_all(cluster, topic: str) -> list[dict]:
    return [json.loads(v or b"null") for v in read_topic(cluster, topic)]


# make campaign (~160 s with the module's set-up): make test keeps no replica alert under produce
# load without a broker fault, and the same bad records dead-lettered on real Kafka while the job
# goes on, in tests/e2e/test_telemetry_gap.py (whose followers are kept behind on purpose).
@pytest.mark.campaign
@pytest.mark.validation
def test_steady_load_raises_nothing_and_bad_telemetry_goes_to_the_dead_letter_topic(quiet: Quiet) -> None:
    cluster, pipe = quiet.cluster, quiet.pipe
    with ProduceLoad(cluster, STEADY_TOPIC, 2, rate=RATE) as load:
        steady_from = time.time()
        until("half the steady run", lambda: time.time() > steady_from + STEADY_S / 2, STEADY_S, pipe)

        bad = Producer(cluster.client_config())
        for value in BAD_RECORDS:
            bad.produce(pipe.telemetry_topic, value=value, key=b"e2e")
        assert bad.flush(30) == 0
        injected_at = time.time()
        batches_at_injection = len(pipe.batches())

        def dead_letters() -> list[dict]:
            return read_all(cluster, pipe.deadletter_topic)

        until("the dead letters", lambda: len(dead_letters()) >= len(BAD_RECORDS), 120, pipe)
        until("the end of the steady run", lambda: time.time() > steady_from + STEADY_S, STEADY_S, pipe)
        batches = pipe.batches()
        sent = load.sent
    letters = dead_letters()
    shrinks = [c for c in cluster.isr_shrinks(quiet.started) if c.topic == STEADY_TOPIC]
    write_result(
        "steady",
        {
            "scenario": f"steady {RATE} msg/s for {STEADY_S} s, {len(BAD_RECORDS)} bad telemetry records",
            "lag_time_max_ms": LAG_MS,
            "collector_interval_s": COLLECT_INTERVAL_S,
            "messages": sent,
            "batches": len(batches),
            "shrinks": len(shrinks),
            "deadletters": [d.get("reason") for d in letters],
            "rows": [],
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in pipe.alerts()],
        },
    )
    assert not pipe.alerts(), f"alerts under steady load: {[e.body for e in pipe.alerts()]}"
    assert not shrinks, f"the leaders shrank the ISR under steady load: {shrinks}"
    reasons = sorted(d.get("reason") for d in letters)
    assert reasons == sorted(BAD_RECORDS.values()), letters
    # The job kept running on good telemetry after the bad records.
    after = [b for b in batches[batches_at_injection:] if b[1] > 0]
    assert len(after) >= 5, f"too few batches with observations after the bad records: {after}"
    assert injected_at < time.time()


# make campaign (~100 s): make test keeps no replica alert under steady load on the same cluster and
# job (the test above) and leader changes by unit test (tests/streaming/test_replicas.py).
@pytest.mark.campaign
def test_leaders_moving_under_load_raise_no_replica_alert(quiet: Quiet) -> None:
    leaders_moved_under_load(quiet.cluster, quiet.pipe, watched_before=WATCHED)


# make campaign (~70 s): make test keeps the burst example by unit test (tests/isrwatch/test_rule.py)
# and on Spark (tests/streaming/test_every_observation.py).
@pytest.mark.campaign
@pytest.mark.validation
def test_burst_absorbed_by_healthy_followers_raises_no_out_of_sync_and_no_shrink(quiet: Quiet) -> None:
    cluster, pipe, topic = quiet.cluster, quiet.pipe, BURSTY_TOPIC
    light_from = time.time()
    with ProduceLoad(cluster, topic, 2, rate=50, size=MESSAGE_BYTES) as load:
        seen = len(pipe.batches())
        until("two batches under the light load", lambda: len(pipe.batches()) > seen + 1, 60, pipe)
        burst_at = time.time()
        batches_at_burst = len(pipe.batches())
        load.burst(BURST)  # returns once every message is acknowledged by its leader
        burst_s = time.time() - burst_at
        # Watch two lag windows: a shrink the burst caused would be logged by then.
        watch_until = time.time() + 2 * LAG_MS / 1000
        until("two lag windows after the burst", lambda: time.time() > watch_until, 4 * LAG_MS / 1000, pipe)
        batches_after = pipe.batches()[batches_at_burst:]
    # The module's last test: its pipeline is stopped here, as the replay below had it stopped
    # when the burst had a pipeline of its own (a second Spark beside the job slowed it 3x).
    pipe.close()
    shrinks = [c for c in cluster.isr_shrinks(quiet.started) if c.topic == topic]
    # every alert of the pipeline's life (the steady run's too)
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
    # (the leader changes' topic excepted: its alerts are held to the leaders' shrinks by its own test)
    critical = [e.body for e in alerts if e.name in bad and e.replica[0] != LEADERS_TOPIC]
    assert not critical, "an absorbed burst raised a critical alert"

    rules = ["--rule", "legacy-messages", "--rule", "kip16", "--rule", "kip16-refined"]
    messages = ["--lag-max-messages", ",".join(map(str, MESSAGE_LIMITS))]
    # the telemetry of this test (the light load, the burst, the two windows), not the steady run's
    since = ["--since", str(int(light_from * 1000))]
    replayed = replay_telemetry(
        cluster, pipe.telemetry_topic, "--lag-time-max-ms", str(LAG_MS), *rules, *messages, *since
    )
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
