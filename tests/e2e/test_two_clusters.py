"""Issue 52: two watched clusters numbered alike, one of them carrying isrwatch's telemetry.

Two real 3-broker Kafka 0.9 clusters, ``alpha`` and the pipeline's own (``tests.e2e.pipeline.CLUSTER``,
called beta here), with the same broker ids (1-3), the same ``load`` topic (6 partitions, 3
replicas, placed by Kafka on each) and different ``replica.lag.time.max.ms`` (8 s, as in the issue's run, and 20 s).
isrwatch's topics are on beta, laid out as docs/deploy.md tells a user (one replica per
partition, placed by Kafka): beta's faults reach the job's own data, and the job's own look at
its brokers (streaming/driver/brokerwatch.py) sees beta's brokers, never alpha's. One collector per
cluster, one job.

Broker 3 is paused on each cluster in turn, as in the issue's run (broker 1 is the fixture's
controller; the controller's own pause, and KAFKA-2729 after it, is test_broker_pauses.py's):

* beta's broker 3 for 7 s (under half of beta's lag, so the broker drops nothing): no lag
  alert for anyone, in particular no Nearing from a crossing after the broker answered the job
  again (the issue's +15 s warning after a +12 s resume), and nothing at all for alpha;
* beta's broker 3 until beta's leaders drop it, then alpha's broker 3 until alpha's do: every
  real shrink is warned first, with lead >= lag/2 - interval - 1 s under that cluster's own lag
  (``results.check_nearing_lead``), and no replica alert names the other cluster; within the
  faulted cluster every replica alert is of the paused broker or of a follower its brokers
  logged out of the ISR (a paused leader, resumed, shrinks its ISR to itself).

In make campaign (~2.5-3.5 min; make test keeps what the comment above the test names): the
regression test of a false critical alert for a healthy cluster on real Kafka. On the code before issue 52's fix it failed in the short pause: Nearing and Stalled for alpha's
broker 3, 4 s into beta's pause (2026-12-04).

The second test (make campaign) gives the clusters a fleet's shape: alpha polled every 6 s, so
most of the job's batches observe fewer than half the replicas it holds (its docstring). Its
first run found false Nearings for alpha's healthy followers: a follower that keeps up is a
poll interval behind at each observation, and the lookahead carried it to its crossing before
the next round (streaming/driver/lookahead.py, ``Lookahead.observe``'s ``prev_t_ms``).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from typing import Any

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pauses import layout, pause_round
from tests.e2e.pipeline import CLUSTER, COLLECT_INTERVAL_S, ZK_SESSION_MS, AlertEvent, Pipeline, until
from tests.e2e.results import Shrinks, check_nearing_lead, write_result

TOPIC = "load"
PARTITIONS = 6
ALPHA_LAG_MS = 8_000  # as in the run: a short lag lets a few seconds of standing telemetry speak
BETA_LAG_MS = 20_000
BROKER = 3
SHORT_PAUSE_S = 7.0  # under half of beta's lag: the broker drops nothing
LAG_ALERTS = {AlertName.NEARING.value, AlertName.IMMINENT.value, AlertName.OUT_OF_SYNC.value}


class ClusterView:
    """The pipeline as ``pauses.pause_round`` reads it, with the alerts of one cluster only:
    the two clusters share topic names and broker ids, only the ``cluster`` label tells them apart."""

    def __init__(self, pipe: Pipeline, cluster: str) -> None:
        self.pipe, self.cluster = pipe, cluster

    def alerts(self, name: str | None = None, status: str | None = None) -> list[AlertEvent]:
        return [e for e in self.pipe.alerts(name, status) if e.labels.get("cluster") == self.cluster]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipe, name)


def _replica_alerts(events: list[AlertEvent]) -> list[AlertEvent]:
    """The alerts of a replica or a partition (not IsrwatchTelemetryStale, a cluster's)."""
    return [e for e in events if e.replica[1] >= 0]


def _explained(e: AlertEvent, cluster: Any, paused_at: float) -> bool:
    """A replica alert of the faulted cluster: of the paused broker, or of a follower its
    brokers logged out of the ISR since the pause."""
    topic, partition, broker = e.replica
    return broker == BROKER or Shrinks.read(cluster, topic, paused_at).first(partition, broker) is not None


def _kept_apart(name: str, cluster: Any, other: str, r: dict[str, Any]) -> list[AlertEvent]:
    """The replica alerts of ``name``'s pause round ``r``: none of the ``other`` cluster, each of
    ``name``'s explained by the pause or a shrink (asserted); ``name``'s firing ones."""
    events = _replica_alerts(r["events"])
    crossed = [e for e in events if e.labels.get("cluster") == other]
    assert not crossed, f"{name}'s pause alerted {other}: {[(e.name, e.status, e.replica) for e in crossed]}"
    mine = [e for e in events if e.labels.get("cluster") == name and e.status == "firing" and e.replica[2] >= 0]
    unexplained = [(e.name, e.replica) for e in mine if not _explained(e, cluster, r["paused_at"])]
    assert not unexplained, f"{name}: alerts no shrink and no pause explain: {unexplained}"
    return mine


# make campaign (~2.5 min, two clusters): make test keeps clusters numbered alike kept apart in one
# job (tests/streaming/test_job.py), the job's own evidence of its brokers given to the right one of
# them (tests/streaming/test_lookahead.py) and a pause's lead on real Kafka (test_hung_telemetry_broker.py).
@pytest.mark.campaign
def test_a_pause_on_either_of_two_clusters_numbered_alike_alerts_for_that_cluster_alone(
    kafka_cluster_factory, tmp_path
):
    alpha = kafka_cluster_factory(replica_lag_time_max_ms=ALPHA_LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    beta = kafka_cluster_factory(replica_lag_time_max_ms=BETA_LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    assert sorted(alpha.broker_ids) == sorted(beta.broker_ids) == [1, 2, 3]
    for c in (alpha, beta):
        c.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    placed = {"alpha": layout(alpha, TOPIC), CLUSTER: layout(beta, TOPIC)}
    rounds: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        for c in (alpha, beta):
            stack.enter_context(ProduceLoad(c, TOPIC, PARTITIONS, rate=200))
        pipe = stack.enter_context(Pipeline(beta, tmp_path))
        pipe.add_watched_cluster(alpha, "alpha")
        views = {"alpha": ClusterView(pipe, "alpha"), CLUSTER: ClusterView(pipe, CLUSTER)}
        pipe.wait_watching(2 * 2 * PARTITIONS)
        pipe.wait_steady()
        assert not _replica_alerts(pipe.alerts()), "no replica alert before the first fault"

        # 1. A short pause of beta's broker 3: silent to the job, answering again before any crossing.
        short_from = len(pipe.alerts())
        short_at = time.time()
        beta.pause(BROKER)
        try:
            time.sleep(SHORT_PAUSE_S)
        finally:
            beta.resume(BROKER)
        resumed_at = time.time()
        # past the crossing the old status called for (lag/2 from the pause), and the telemetry after it
        seen = len(pipe.batches())
        until(
            "the job's batches past beta's crossing",
            lambda: time.time() > short_at + BETA_LAG_MS / 2000 + 8 and len(pipe.batches()) >= seen + 3,
            120,
            pipe,
        )
        short = pipe.alerts()[short_from:]
        rounds["short"] = {
            "paused_at": short_at,
            "resumed_at": resumed_at,
            "alerts": [[e.arrived - short_at, e.name, e.status, e.labels.get("cluster"), *e.replica] for e in short],
        }

        # 2. Beta's broker 3 until beta's leaders drop it, then alpha's broker 3 until alpha's do.
        for name, cluster in ((CLUSTER, beta), ("alpha", alpha)):
            start = len(pipe.alerts())
            r = pause_round(cluster, views[name], TOPIC, BROKER, placed[name], None)
            r["all_alerts"] = [
                [e.arrived - r["paused_at"], e.name, e.status, e.labels.get("cluster"), *e.replica]
                for e in pipe.alerts()[start:]
            ]
            r["events"] = pipe.alerts()[start:]
            rounds[name] = r
        every = pipe.alerts()
        identified = [line for line in pipe.job_log().splitlines() if "telemetry_cluster_" in line]

    write_result(
        "two_clusters_numbered_alike",
        {
            "scenario": "two watched clusters with the same broker ids and topic layout, telemetry on one; "
            "broker 3 paused 7 s on it, then until the shrinks on each cluster in turn",
            "lag_time_max_ms": {"alpha": ALPHA_LAG_MS, CLUSTER: BETA_LAG_MS},
            "collect_interval_s": COLLECT_INTERVAL_S,
            "identified": identified,
            "short": rounds["short"],
            "rounds": {k: {x: v for x, v in r.items() if x != "events"} for k, r in rounds.items() if k != "short"},
        },
    )
    assert any(f"cluster={CLUSTER} by=endpoints" in line for line in identified), identified
    assert not any("cluster=alpha by=" in line for line in identified), identified

    # The short pause: Stalled for beta's broker 3 at most (silent to the job), no lag alert.
    assert not [e for e in rounds["short"]["alerts"] if e[3] != CLUSTER and e[6] >= 0], rounds["short"]
    assert not [e for e in rounds["short"]["alerts"] if e[1] in LAG_ALERTS], rounds["short"]
    assert all(e[1] == AlertName.STALLED.value and e[6] == BROKER for e in rounds["short"]["alerts"] if e[6] >= 0)

    for name, cluster, other in ((CLUSTER, beta, "alpha"), ("alpha", alpha, CLUSTER)):
        r = rounds[name]
        for row in r["rows"]:
            check_nearing_lead(row, f"{name} {TOPIC}-{row['partition']} on broker {BROKER}")
        mine = _kept_apart(name, cluster, other, r)
        # no warning of the paused follower from a crossing after it answered again
        late = [
            (e.name, e.replica, e.starts_at - r["resumed_at"])
            for e in mine
            if e.name in LAG_ALERTS and e.replica[2] == BROKER and e.starts_at > r["resumed_at"] + 1.0
        ]
        assert not late, f"{name}: warnings from crossings after the resume: {late}"
    # Over the whole run, alpha's replica alerts came in alpha's round only.
    early = [e for e in _replica_alerts(every) if e.labels.get("cluster") == "alpha"]
    assert all(e.arrived >= rounds["alpha"]["paused_at"] for e in early), [(e.name, e.replica) for e in early]


SLOW_INTERVAL_S = 6.0  # alpha's collector in the fleet-shape test: a round every few of the job's batches
SHAPE_LAG_MS = 20_000


# make campaign (~5 min, two clusters): make test keeps the observed replicas' evaluation equal to
# the whole table's, batch for batch on Spark (tests/streaming/test_window_choice.py,
# tests/streaming/test_state_table.py).
@pytest.mark.campaign
def test_a_cluster_polled_every_few_triggers_is_warned_while_batches_evaluate_only_what_they_observe(
    kafka_cluster_factory, tmp_path
):
    """The fleet's shape on real Kafka: when a batch observed fewer than half the replicas held,
    the next evaluates only the replicas it observes and writes the state table as a delta
    (docs/streaming.md, "The state"). Beta (the pipeline's own cluster, isrwatch's topics on it as
    docs/deploy.md lays them out) is polled every 0.5 s and has 4 followers, alpha every 6 s with
    12: most batches hold beta's observations alone (4 of the 16 held). Broker 3 of alpha, then of
    beta, paused until its leaders drop it: every real shrink warned first, the crossing's lead
    at least lag/2 - that cluster's poll interval - 1 s (the job's last-caught-up time is within
    a round of the broker's), no replica alert of the other cluster, every one of the faulted
    cluster explained by the pause or a shrink; and the job's log shows batches of each round
    evaluated that way (``window=observed``), else this run did not exercise it."""
    alpha = kafka_cluster_factory(replica_lag_time_max_ms=SHAPE_LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    beta = kafka_cluster_factory(replica_lag_time_max_ms=SHAPE_LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    alpha.create_topic(TOPIC, partitions=6, replication_factor=3)
    beta.create_topic(TOPIC, partitions=2, replication_factor=3)
    placed = {"alpha": layout(alpha, TOPIC), CLUSTER: layout(beta, TOPIC)}
    intervals = {"alpha": SLOW_INTERVAL_S, CLUSTER: COLLECT_INTERVAL_S}
    rounds: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(ProduceLoad(alpha, TOPIC, 6, rate=200))
        stack.enter_context(ProduceLoad(beta, TOPIC, 2, rate=100))
        pipe = stack.enter_context(Pipeline(beta, tmp_path))
        pipe.add_watched_cluster(alpha, "alpha", SLOW_INTERVAL_S)
        views = {"alpha": ClusterView(pipe, "alpha"), CLUSTER: ClusterView(pipe, CLUSTER)}
        pipe.wait_watching(2 * 6 + 2 * 2)
        pipe.wait_steady(lag_s=SLOW_INTERVAL_S + 5.0)
        assert not _replica_alerts(pipe.alerts()), "no replica alert before the first fault"
        for name, cluster in (("alpha", alpha), (CLUSTER, beta)):
            start, lines = len(pipe.alerts()), len(pipe.job_log().splitlines())
            r = pause_round(cluster, views[name], TOPIC, BROKER, placed[name], None)
            r["events"] = pipe.alerts()[start:]
            r["windows"] = Counter(
                m.group(1)
                for m in re.finditer(
                    r"\bbatch batch_id=.*\bwindow=(\w+)", "\n".join(pipe.job_log().splitlines()[lines:])
                )
            )
            rounds[name] = r

    write_result(
        "two_clusters_fleet_shape",
        {
            "scenario": f"two watched clusters, alpha polled every {SLOW_INTERVAL_S:g} s (12 followers), "
            f"beta every {COLLECT_INTERVAL_S:g} s (4 followers, isrwatch's topics); broker 3 paused on each",
            "lag_time_max_ms": SHAPE_LAG_MS,
            "rounds": {
                k: {
                    **{x: v for x, v in r.items() if x not in ("events", "windows")},
                    "windows": dict(r["windows"]),
                    "all_alerts": [
                        [e.arrived - r["paused_at"], e.name, e.status, e.labels.get("cluster"), *e.replica]
                        for e in r["events"]
                    ],
                }
                for k, r in rounds.items()
            },
        },
    )
    for name, cluster, other in (("alpha", alpha, CLUSTER), (CLUSTER, beta, "alpha")):
        r = rounds[name]
        assert r["windows"].get("observed", 0) > 0, f"{name}'s round: no batch evaluated its observed replicas alone"
        floor = SHAPE_LAG_MS / 2000 - intervals[name] - 1.0
        assert r["rows"], f"{name}: no follower of broker {BROKER}"
        for row in r["rows"]:
            where = f"{name} {TOPIC}-{row['partition']} on broker {BROKER}"
            assert row["alert_arrived"] is not None, f"no Nearing alert for {where}: {row}"
            assert row["arrival_lead_s"] is not None and row["arrival_lead_s"] > 0, f"{where}: after the shrink: {row}"
            assert row["lead_s"] is not None and row["lead_s"] >= floor, f"{where}: lead < {floor} s: {row}"
        _kept_apart(name, cluster, other, r)
