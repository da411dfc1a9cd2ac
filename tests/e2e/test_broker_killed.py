"""A broker killed (SIGKILL) on a cluster with Kafka 0.9's own defaults, then started again.

Real 3-broker Kafka 0.9 with its defaults (a 6 s ZooKeeper session, a 10 s
``replica.lag.time.max.ms``), the README's deployment (isrwatch's topics on the watched
cluster, as docs/deploy.md creates them and placed by Kafka, so the killed broker leads some
of them), produce load on a topic of three partitions of three replicas placed by Kafka, so
the killed broker follows two and leads one.

Once the broker's session expires the controller drops it from every ISR, moves its
leadership, and stops listing it in any partition's replicas, all in one metadata update. The
broker killed is not the controller, and that is the fault under test: a killed controller's
successor shows it out of the ISRs before it leaves the replicas (measured: its replicas went
out of sync in the job without the collector keeping them), so it would not show whether the
collector keeps a broker's replicas once the metadata leaves them out. While it is down, for
every partition, including the one it led:

* the job prints ``KafkaReplicaOutOfSync`` and ``KafkaReplicaStalled`` for its replica, which
  stay firing until the broker is back;
* the job's /metrics shows the replica out of the ISR, and its time since caught up keeps
  growing after the metadata has left the broker out (not frozen at what it was then).

Started again, it rejoins and every alert of its replicas resolves; no replica alert of the
run names another broker.
"""

from __future__ import annotations

import time

import requests

from isrwatch.alerts import AlertName
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pauses import layout
from tests.e2e.pipeline import Pipeline, until
from tests.e2e_observability.running_job import parse_metrics

# Kafka 0.9's defaults (zookeeper.session.timeout.ms, replica.lag.time.max.ms)
ZK_SESSION_MS = 6000
LAG_MS = 10_000
DOWN_S = 45.0  # how long the broker stays down: the session and the controller's work, and more
TOPIC = "orders"
PARTITIONS = 3


def _gauges(pipe: Pipeline, broker: int) -> dict[int, dict[str, float]]:
    """partition -> {metric: value} of the job's /metrics for ``broker``'s replicas of TOPIC."""
    text = requests.get(f"http://127.0.0.1:{pipe.metrics_port}/metrics", timeout=5).text
    out: dict[int, dict[str, float]] = {}
    for (name, labels), value in parse_metrics(text).items():
        lab = dict(labels)
        if lab.get("topic") == TOPIC and lab.get("broker_id") == str(broker):
            out.setdefault(int(lab["partition"]), {})[name] = value
    return out


def test_a_killed_broker_stays_out_of_sync_until_it_is_back(kafka_cluster_factory, tmp_path):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    with ProduceLoad(cluster, TOPIC, PARTITIONS, rate=300), Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(2 * PARTITIONS)
        pipe.wait_steady()
        assert not [e for e in pipe.alerts() if e.replica[2] >= 0], "no replica alert before the fault"
        controller = cluster.controller_id()
        victim = next(b for b in cluster.broker_ids if b != controller)  # the docstring says why
        led = [p for p, (leader, _) in layout(cluster, TOPIC).items() if leader == victim]
        witness = next(b for b in cluster.broker_ids if b != victim)
        mine = {(TOPIC, p, victim) for p in range(PARTITIONS)}
        killed_at = time.time()
        cluster.stop(victim)  # SIGKILL: no controlled shutdown

        def firing(name: AlertName) -> set[tuple[str, int, int]]:
            return {e.replica for e in pipe.alerts(name.value, "firing") if e.arrived >= killed_at}

        until(
            f"KafkaReplicaOutOfSync and KafkaReplicaStalled for every replica on broker {victim}",
            lambda: mine <= firing(AlertName.OUT_OF_SYNC) and mine <= firing(AlertName.STALLED),
            DOWN_S,
            pipe,
        )
        until(
            f"the metadata to leave broker {victim} out",
            lambda: victim not in (cluster.metadata_brokers(witness) or {victim}),
            DOWN_S,
            pipe,
        )
        time.sleep(3)  # a round and a batch after it
        first = _gauges(pipe, victim)
        time.sleep(max(10.0, killed_at + DOWN_S - time.time()))
        second = _gauges(pipe, victim)
        resolved_while_down = [
            e for e in pipe.alerts(status="resolved") if e.replica in mine and e.arrived >= killed_at
        ]
        started_at = time.time()
        cluster.start_broker(victim)

        def all_resolved() -> bool:
            fired = {e.identity for e in pipe.alerts(status="firing") if e.replica in mine}
            return fired <= {e.identity for e in pipe.alerts(status="resolved") if e.arrived >= started_at}

        until(f"every alert of broker {victim}'s replicas resolved", all_resolved, 120, pipe)
        events = pipe.alerts()

    assert led, f"broker {victim} led none of {TOPIC}'s partitions"
    assert not resolved_while_down, f"alerts resolved while broker {victim} was down: {resolved_while_down}"
    for p in range(PARTITIONS):
        assert first[p]["isrwatch_replica_in_isr"] == 0 == second[p]["isrwatch_replica_in_isr"], (p, first, second)
        # its gauges keep moving: the telemetry still carries it, silent
        t1, t2 = (g[p]["isrwatch_replica_time_since_caught_up_seconds"] for g in (first, second))
        assert t2 >= t1 + 5, f"partition {p}: time since caught up {t1} then {t2}: frozen"
    others = [e for e in events if e.replica[2] >= 0 and e.replica not in mine]
    assert not others, f"replica alerts for other brokers: {others}"
