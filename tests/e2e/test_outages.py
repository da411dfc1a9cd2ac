"""Issue 14, item 3: the telemetry cluster unreachable for two minutes.

Real parts: a watched 3-broker Kafka 0.9 cluster under produce load, nothing wrong with
it; isrwatch's own topics on a separate one-broker telemetry cluster (the recommended
layout, docs/deploy.md); the real collector and job as processes. The telemetry broker
is paused (SIGSTOP: it neither answers nor refuses, the harder case) for two minutes.

* both processes keep running through it (the collector's producer queues and re-sends,
  the job's source plans nothing from a leader that does not answer);
* the job raises ``IsrwatchTelemetryStale`` exactly once, during the outage, and it
  resolves after the broker is back;
* no replica alert, during or after: the gap in telemetry is not lag (docs/rule.md);
* afterwards the job catches up: its micro-batches again hold telemetry from after
  the outage, and it evaluates every follower of the watched topic again.

Two minutes of outage make this a campaign (``make reliability``, ``make campaign``).
"""

from __future__ import annotations

import re
import time

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import write_result
from tests.e2e.test_telemetry_gap import stale_episodes, stale_firing

pytestmark = pytest.mark.slow

OUTAGE_S = 120.0
AFTER_S = 40.0
TOPIC = "outage"
# every broker leads one partition and follows two: six follower replicas
ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
FOLLOWERS = 6
STALE = AlertName.TELEMETRY_STALE.value
_BATCH = re.compile(r"\bbatch batch_id=(\d+) .*\btelemetry_lag_s=([\d.]+)")


def _batches(pipe: Pipeline) -> list[tuple[float, int, float]]:
    """(wall time read, batch id, telemetry lag) of every batch line so far: the log's own
    timestamps are the job's clock, so the wall time is taken from the line's prefix."""
    out = []
    for line in pipe.job_log().splitlines():
        m = _BATCH.search(line)
        if m:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            out.append((stamp, int(m.group(1)), float(m.group(2))))
    return out


def test_the_telemetry_cluster_unreachable_for_two_minutes(kafka_cluster_factory, tmp_path):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    # The telemetry broker's ZooKeeper session outlives the pause, as a real broker's would
    # across a network partition shorter than its session: a session that expired would
    # make the broker re-register, which is not the fault measured here.
    telemetry = kafka_cluster_factory(brokers=1, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    cluster.create_topic(TOPIC, assignment=ASSIGNMENT)
    with (
        ProduceLoad(cluster, TOPIC, len(ASSIGNMENT), rate=200),
        Pipeline(cluster, tmp_path, telemetry_cluster=telemetry) as pipe,
    ):
        pipe.wait_watching(FOLLOWERS)
        until("no IsrwatchTelemetryStale firing before the outage", lambda: stale_firing(pipe) is None, 120, pipe)
        assert not [e for e in pipe.alerts() if "broker_id" in e.labels], "no replica alert before the outage"
        before = len(stale_episodes(pipe.alerts(STALE)))
        down_at = time.time()
        telemetry.pause(1)
        try:
            until("the end of the outage", lambda: time.time() >= down_at + OUTAGE_S, OUTAGE_S + 30, pipe)
        finally:
            telemetry.resume(1)
        up_at = time.time()
        until("IsrwatchTelemetryStale to resolve", lambda: stale_firing(pipe) is None, 180, pipe)

        def caught_up() -> bool:
            # a batch that started after the outage and holds telemetry from after it
            return any(t > up_at and t - lag > up_at for t, _, lag in _batches(pipe))

        until("a batch of telemetry from after the outage", caught_up, 180, pipe)
        until(f"{AFTER_S:.0f}s after the outage", lambda: time.time() >= up_at + AFTER_S, AFTER_S + 60, pipe)
        for what in ("collector", "job"):
            pipe.check_alive(f"the {what} through the outage")
        events = pipe.alerts()
        batches = _batches(pipe)
        collector_log = pipe.collector.log() if pipe.collector is not None else ""

    episodes = stale_episodes(events)[before:]
    replica_alerts = [e for e in events if "broker_id" in e.labels]
    lost = [int(n) for n in re.findall(r"\blost=(\d+)", collector_log)]
    write_result(
        "outage_telemetry_cluster",
        {
            "scenario": "the separate telemetry cluster's broker paused (SIGSTOP) for two minutes",
            "outage_s": OUTAGE_S,
            "down_at": down_at,
            "up_at": up_at,
            "stale_episodes": episodes,
            "replica_alerts": len(replica_alerts),
            "batches_during_outage": sum(1 for t, _, _ in batches if down_at < t < up_at),
            "first_batch_after": min((t - up_at for t, _, _ in batches if t > up_at), default=None),
            "collector_records_lost": max(lost, default=0),
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in events],
        },
    )
    assert len(episodes) == 1, f"IsrwatchTelemetryStale episodes after the outage began: {episodes}"
    fired, resolved = episodes[0]
    assert down_at < fired < up_at, f"stale fired at {fired}, outage {down_at}..{up_at}"
    assert resolved is not None and resolved > up_at, f"stale resolved at {resolved}, the outage ended {up_at}"
    assert not replica_alerts, "replica alerts from a telemetry outage: " + "; ".join(
        f"{e.name} {e.status} {e.replica}" for e in replica_alerts
    )
