"""The fleet's state topic thinned on real Kafka: ``--driver-replicas not-ok --ok-refresh-batches N``.

A replica that stays ok has its state-topic record written at its first observation and then
each time its count of observations passes a multiple of N (docs/state-topic.md, "When"),
by the executors; the exporter on the topic serves every replica all the while. The Spark
test of the rule (tests/streaming/test_driver_replicas.py) goes through the job's handler with
a stand-in writer; this one is the job a user runs.

The session's real 3-broker Kafka (no fault: nothing to restore), collector and job as
``isrwatch`` processes, isrwatch's own topics placed by Kafka (``Pipeline.create_topics``). A
light steady load on a topic of three partitions, each broker leading one and following two: six
followers, none slowed. Once the job has run 30 batches after it watches them, the state topic
is read (every record: its segments are not compacted yet) and held to the job's own batch lines:

* in all, no more records than the observations the batches counted, divided by N, plus two per
  replica (the first and a partial count), where the rule without N writes one per replica per
  batch (several times more at this shape: the collector polls every 0.5 s, a batch takes
  seconds, so each batch holds several observations of each replica);
* each follower of the topic has its first record and at least one refresh after it;
* no alert (nothing was slowed), and the exporter serves every follower of the topic.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from typing import Any

import pytest

from tests.e2e.kafka_io import ProduceLoad, read_records
from tests.e2e.pipeline import Pipeline, until

pytestmark = pytest.mark.campaign

TOPIC = "refreshed"
N = 40  # observations: at a 0.5 s poll, a refresh every ~20 s
BATCHES = 30


def _exporter_followers(port: int) -> set[tuple[int, int]]:
    """(partition, broker) of each follower of ``TOPIC`` the exporter has a lag ratio for."""
    from tests.e2e_observability.running_job import parse_metrics

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = parse_metrics(r.read().decode())
    except OSError:
        return set()
    out = set()
    for (name, labels), _ in metrics.items():
        lab = dict(labels)
        if name == "isrwatch_replica_lag_ratio" and lab.get("topic") == TOPIC:
            out.add((int(lab["partition"]), int(lab["broker_id"])))
    return out


def test_ok_replicas_records_come_at_every_n_th_observation_and_the_exporter_serves_all(
    kafka_cluster: Any, tmp_path: Any
) -> None:
    cluster = kafka_cluster
    # (each broker leading one partition: pinned so that the six followers are known beforehand)
    assignment = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    cluster.create_topic(TOPIC, assignment=assignment)
    followers = {(p, b) for p, replicas in enumerate(assignment) for b in replicas[1:]}
    pipeline = Pipeline(cluster, tmp_path, job_args=["--driver-replicas", "not-ok", "--ok-refresh-batches", str(N)])
    with ProduceLoad(cluster, TOPIC, 3, rate=50), pipeline as pipe:
        exporter = pipe.start_exporter()
        pipe.wait_watching(len(followers))
        start = len(pipe.batches())
        until(f"{BATCHES} more batches", lambda: len(pipe.batches()) >= start + BATCHES, 180, pipe)
        until("the exporter to serve every follower", lambda: _exporter_followers(exporter) >= followers, 60, pipe)
        batches = pipe.batches()
        records = read_records(cluster, pipe.state_topic, compacted=True)
        alerts = pipe.alerts()

    observations = sum(obs for _, obs, _, _ in batches)
    per_key = Counter(key.decode() for _, _, key, value in records if key is not None and value is not None)
    ok = [json.loads(value) for _, _, _, value in records if value is not None]
    assert ok and all(r["state"] == "ok" for r in ok), Counter(r["state"] for r in ok)
    assert not alerts, [e.body for e in alerts]
    bound = observations / N + 2 * len(per_key)
    print(
        f"{len(batches)} batches, {observations} observations of {len(per_key)} replicas, "
        f"{len(records)} state records (bound {bound:.0f} at N={N}; one per replica per batch: "
        f"{sum(r for _, _, r, _ in batches)})"
    )
    assert len(records) <= bound, f"{len(records)} records for {observations} observations at N={N}"
    mine = {k: n for k, n in per_key.items() if k.split("/")[1] == TOPIC}
    assert {(int(k.split("/")[2]), int(k.split("/")[3])) for k in mine} == followers, sorted(mine)
    assert all(n >= 2 for n in mine.values()), f"a follower with no refresh after its first record: {mine}"
