"""A partition reassigned down to one of its followers: that replica stops being shown as a follower.

The collector observes followers only, and the job forgets a follower elected leader when the
partition's other followers' observations name it (test_nearing_follower_leads). A partition
left with one replica has no other follower: before the collector said such a replica gone
(``collector.tracker``: a follower that fresh metadata shows as its partition's only replica),
the job kept its last follower status, its series (and any alert firing for it) for its
forget time, 15 minutes on the cluster's clock. The soak showed it with topics deleted and
created again with one replica; a reassignment down to one replica is the same case, made
deterministic here.

Real 3-broker Kafka 0.9 (the session's shared cluster: a reassignment faults no broker),
isrwatch's topics placed by Kafka, a real Prometheus scraping the job and the exporter with
the shipped rules. The watched topic's partition has broker 1 leading and 2 and 3 following;
it is reassigned to broker 2 alone. Within ``CLEAR_S`` of the reassignment's end, Prometheus
must show no follower of the topic from either target: broker 3's replica, no longer listed,
is said gone after the collector's wait (~5 s), broker 2's, now the sole leader, at the first
round that shows it.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.e2e.gauges import prometheus_followers, prometheus_scraping
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pauses import layout
from tests.e2e.pipeline import Pipeline, until
from tests.e2e.results import write_result

# The collector's gone wait (~5 s), the job's next batch, the exporter's poll of the state
# topic, Prometheus's next scrape (every second) marking the series stale: well under a minute
# on a loaded 2-core machine, against the 15 minutes before the fix.
CLEAR_S = 60.0
SOLE = 2


# make campaign (~40 s): make test keeps a sole replica said gone by unit test
# (tests/collector/test_tracker.py).
@pytest.mark.campaign
def test_a_follower_left_its_partition_s_only_replica_is_no_longer_shown_as_a_follower(
    kafka_cluster, unique_name, tmp_path
):
    cluster = kafka_cluster
    topic = unique_name("sole")
    # the watched topic pinned so that a follower (broker 2) is left its only replica;
    # isrwatch's own topics are placed by Kafka (Pipeline.create_topics)
    cluster.create_topic(topic, assignment=[[1, SOLE, 3]])
    load = ProduceLoad(cluster, topic, 1, rate=50, size=200)
    with Pipeline(cluster, tmp_path) as pipe, contextlib.ExitStack() as stack:
        load.start()
        stack.callback(load.stop)
        prom = stack.enter_context(prometheus_scraping(pipe, tmp_path))
        job_target = f"127.0.0.1:{pipe.metrics_port}"
        exporter_target = f"127.0.0.1:{pipe.exporter_port}"
        for target in (job_target, exporter_target):
            until(
                f"Prometheus to show {topic}'s followers from {target}",
                lambda t=target: prometheus_followers(prom.url, topic, t)["series"] == {(0, SOLE), (0, 3)},
                120,
                pipe,
            )
        started_at = time.time()
        cluster.reassign(topic, 0, [SOLE])
        reassigned_at = time.time()
        until(
            f"the metadata to show broker {SOLE} the only replica and leader of {topic}-0",
            lambda: layout(cluster, topic) == {0: (SOLE, (SOLE,))},
            30,
            pipe,
        )
        until(
            f"Prometheus to show no follower of {topic}",
            lambda: not any(prometheus_followers(prom.url, topic).values()),
            CLEAR_S,
            pipe,
        )
        cleared_at = time.time()
        collector_log = pipe.collector.log() if pipe.collector else ""
        job_log = pipe.job_log()
    write_result(
        "sole_replica",
        {
            "scenario": f"{topic}-0 reassigned from [1, {SOLE}, 3] to [{SOLE}] under light load",
            "reassignment_s": round(reassigned_at - started_at, 1),
            "prometheus_clear_after_reassignment_s": round(cleared_at - reassigned_at, 1),
        },
    )
    assert f"{topic}/0/{SOLE}" in collector_log, f"the collector did not say {topic}/0/{SOLE} gone"
    assert "replicas_gone" in job_log
