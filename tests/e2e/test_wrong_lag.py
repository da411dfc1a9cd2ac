"""Issue 14, item 5, second half: isrwatch given a ``replica.lag.time.max.ms`` that is not the
brokers' says so, from what the brokers do (Kafka 0.9 shows the value neither over the
protocol nor over JMX, so nothing can be read and compared).

Real parts: a 3-broker Kafka 0.9 cluster with ``replica.lag.time.max.ms`` = ``LAG_MS``,
``isrwatch collect --source jmx`` (the leaders' own shrink counts: the evidence needs them,
isrwatch.outcomes) and ``isrwatch run``, both given the wrong value as a user would (the same
``--lag-time-max-ms`` to both, as docs/kafka.md says), produce load, isrwatch's topics on the
watched cluster placed by Kafka. One follower broker (not the controller: its pause would
also move the cluster's leadership, which is another test's subject) is paused until its
leaders drop it, then resumed.

* isrwatch told three times the brokers' value: the leaders drop the paused follower far
  sooner after its last catch-up than that allows, so the job counts ``shorter`` evidence
  and logs ``event=lag_time_max_ms_mismatch direction=shorter``, never ``longer``;
* isrwatch told 3 s (the brokers: 20 s): the job holds the follower not caught up past twice its lag
  plus the margin (2 x 3 + 4 = 10 s) while the leaders' counts show it still in the ISR (they
  drop it 20 to 40 s after its last catch-up, metadata later still: past the 10 s the job
  allows metadata), so ``longer``, never ``shorter``.

The control, isrwatch given the brokers' own value, is
``test_broker_pauses[separate-telemetry-cluster-jmx]`` (make test): no evidence either way.

A campaign (``make campaign``): two rounds of a few minutes each.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import requests

from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pauses import layout, pause_round
from tests.e2e.pipeline import CLUSTER, LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import write_result
from tests.e2e_observability.running_job import parse_metrics

pytestmark = [pytest.mark.campaign, pytest.mark.reliability]

DATA_PARTITIONS = 3
EVIDENCE = "isrwatch_lag_time_evidence_total"
_MISMATCH = re.compile(r"event=lag_time_max_ms_mismatch .*")


def _evidence(pipe: Pipeline) -> dict[str, float]:
    """The job's lag-time evidence counts of the watched cluster, by direction."""
    text = requests.get(f"http://127.0.0.1:{pipe.metrics_port}/metrics", timeout=10).text
    out = {}
    for (name, labels), value in parse_metrics(text).items():
        lab = dict(labels)
        if name == EVIDENCE and lab.get("cluster") == CLUSTER:
            out[lab["direction"]] = value
    return out


@pytest.mark.parametrize(
    ("told_ms", "direction"),
    [(3 * LAG_MS, "shorter"), (LAG_MS * 3 // 20, "longer")],
    ids=["brokers-lag-shorter", "brokers-lag-longer"],
)
def test_a_wrong_lag_time_max_ms_is_warned_from_the_brokers_shrinks(
    kafka_cluster_factory, tmp_path, told_ms, direction
):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    topic = "orders"
    cluster.create_topic(topic, partitions=DATA_PARTITIONS, replication_factor=3)
    placed = layout(cluster, topic)
    other = "longer" if direction == "shorter" else "shorter"
    found: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(ProduceLoad(cluster, topic, DATA_PARTITIONS, rate=300))
        pipe = stack.enter_context(Pipeline(cluster, tmp_path, collector_source="jmx", lag_time_max_ms=told_ms))
        pipe.wait_watching(2 * DATA_PARTITIONS)
        pipe.wait_steady()
        before = _evidence(pipe)
        broker = next(b for b in cluster.broker_ids if b != cluster.controller_id())
        r = pause_round(cluster, pipe, topic, broker, placed, None)

        def counted() -> bool:
            found.update(_evidence(pipe))
            return found.get(direction, 0) > 0 and _MISMATCH.search(pipe.job_log()) is not None

        # the evidence is decided once the leaders' counts have settled (2 x 10 s of telemetry)
        until(f"the job to find the brokers' lag {direction} than {told_ms} ms", counted, 120, pipe)
        lines = _MISMATCH.findall(pipe.job_log())
    write_result(
        f"wrong_lag_{direction}",
        {
            "scenario": f"isrwatch told replica.lag.time.max.ms={told_ms}, the brokers run {LAG_MS}; "
            f"broker {broker} paused",
            "evidence_before_pause": before,
            "evidence": found,
            "evidence_found": found.get(direction, 0),  # the brokers' lag as it is: >= 1
            "evidence_wrong_way": found.get(other, 0) + sum(before.values()),  # 0
            "warnings": lines,
            "round": {k: v for k, v in r.items() if k != "rows"},
        },
    )
    assert not any(before.values()), f"lag-time evidence before any fault: {before}"
    assert r["rows"], f"broker {broker} follows no partition of {topic}: {placed}"
    assert found.get(other, 0) == 0, f"evidence the brokers' lag is {other} too: {found}"
    assert all(f"direction={direction}" in line for line in lines), lines
    assert f"is {direction} than {told_ms}" in lines[0], lines
    assert re.search(rf"follower {topic}-\d+/{broker} ", lines[0]), f"not the paused follower: {lines}"
