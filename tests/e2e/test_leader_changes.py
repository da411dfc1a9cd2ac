"""Leaders moving on a healthy cluster raise no replica alert.

The soak's first complete run (docs/reliability.md) saw one replica of its steady topic
fire Nearing, Imminent and OutOfSync and resolve them in one micro-batch, with no shrink in
the leaders' logs, a while after a broker restart, when Kafka 0.9 moves leadership back to
the restarted broker (its preferred replica). This test moves leaders on a healthy cluster
under load, without restarting anything, and watches for that.

Real 3-broker Kafka 0.9, the README's deployment (collector and job as ``isrwatch``
processes, isrwatch's topics placed by Kafka), 300 msg/s. The watched topic has three
partitions whose replicas are pinned (so that each round can hand leadership to the next
replica: not a user's need, the fault's). Each round reorders every partition's replica list
(``kafka-reassign-partitions`` with the same brokers: no data moves) and elects the preferred
leaders, so every partition changes leader at once; three rounds, every broker leading every
partition once, a lag and a half between rounds.

* every leader change happened (the metadata shows the new leaders) and the collector saw it
  (the telemetry has observations under each new leader);
* no replica alert at all, unless the leaders themselves logged the replica out of the ISR;
* the job completes micro-batches throughout.

It found a defect (2026-11-26, docs/reliability.md), fixed since (docs/rule.md, "The previous
observation, when the collector has none, and leader changes"): a broker that was leader and
became a follower again was announced Nearing, Imminent and OutOfSync at once, and resolved 2-3 s
later, with no shrink in the leaders' logs (the job's state kept the replica's last catch-up from
before it led the partition). Runs in make test, on the cluster and job of the no-fault
tests (tests/e2e/test_steady_load.py, between the steady run and the burst: a leader change is
no fault of a broker, and the job's start is most of a pipeline's cost); this module holds the
scenario and its checks.
"""

from __future__ import annotations

import time
from typing import Any

from tests.e2e.kafka_io import ProduceLoad, read_observations
from tests.e2e.pipeline import LAG_MS, Pipeline, until
from tests.e2e.results import Shrinks, write_result

TOPIC = "orders"
ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
ROUNDS = 3
SETTLE_S = 1.5 * LAG_MS / 1000


def _leaders_seen(cluster, telemetry_topic: str, since_ms: int) -> set[tuple[int, int]]:
    """(partition, leader) pairs of the watched topic's observations after ``since_ms``."""
    return {
        (o.partition, o.leader_id)
        for o in read_observations(cluster, telemetry_topic)
        if o.topic == TOPIC and o.t_ms >= since_ms
    }


def leaders_moved_under_load(cluster: Any, pipe: Pipeline, watched_before: int) -> None:
    """The scenario on a running ``pipe`` whose job watches ``watched_before`` follower replicas
    of other topics: TOPIC is created pinned to ASSIGNMENT, loaded, and its leaders moved."""
    cluster.create_topic(TOPIC, assignment=ASSIGNMENT)
    started = time.time()
    rounds = []
    with ProduceLoad(cluster, TOPIC, len(ASSIGNMENT), rate=300):
        pipe.wait_watching(watched_before + 2 * len(ASSIGNMENT))
        pipe.wait_steady()
        assert not [e for e in pipe.alerts() if e.replica[2] >= 0], "no replica alert before the first leader change"
        replicas = [list(r) for r in ASSIGNMENT]
        for n in range(1, ROUNDS + 1):
            replicas = [r[1:] + r[:1] for r in replicas]  # the next replica first
            moved_at = time.time()
            for partition, order in enumerate(replicas):
                cluster.reassign(TOPIC, partition, order)
            cluster.elect_preferred_leaders(TOPIC, list(range(len(replicas))))
            batches = len(pipe.batches())
            until(
                f"round {n}: {SETTLE_S:.0f} s after the election",
                lambda t=moved_at: time.time() >= t + SETTLE_S,
                120,
                pipe,
            )
            rounds.append(
                {
                    "round": n,
                    "leaders": {p: order[0] for p, order in enumerate(replicas)},
                    "moved_s": round(moved_at - started, 1),
                    "batches_meanwhile": len(pipe.batches()) - batches,
                }
            )
        seen = _leaders_seen(cluster, pipe.telemetry_topic, int(started * 1000))
        events = pipe.alerts()
    # every replica alert of the pipeline's life, of any topic, each against its own topic's shrinks
    replica_alerts = [e for e in events if e.replica[2] >= 0]
    shrinks = {t: Shrinks.read(cluster, t, started) for t in {e.replica[0] for e in replica_alerts}}
    unexplained = [
        [round(e.arrived - started, 1), e.name, e.status, *e.replica]
        for e in replica_alerts
        if shrinks[e.replica[0]].first(e.replica[1], e.replica[2]) is None
    ]
    write_result(
        "leader_changes",
        {
            "scenario": "every partition's leader moved three times under 300 msg/s, nothing restarted",
            "lag_time_max_ms": LAG_MS,
            "rounds": rounds,
            "replica_alerts": len(replica_alerts),
            "replica_alerts_unexplained": unexplained,
        },
    )
    wanted = {(p, leader) for r in rounds for p, leader in r["leaders"].items()}
    assert wanted <= seen, f"the collector never reported some new leaders: {sorted(wanted - seen)}"
    assert all(r["batches_meanwhile"] > 0 for r in rounds), f"the job stopped completing batches: {rounds}"
    assert not unexplained, f"replica alerts with no shrink in the leaders' logs: {unexplained}"
