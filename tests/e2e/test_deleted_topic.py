"""A topic deleted while its followers' alerts fire: the alerts resolve within seconds.

Found by the soak (docs/reliability.md): a replica alert firing when its topic was
deleted stayed firing until the job forgot the replica, 15 minutes later on the
cluster's clock. The collector now says a replica the cluster no longer has ``gone``
(``collector.tracker``: left out of fresh metadata for a few rounds), and the job
forgets it and resolves its alerts with the batch that brings that.

Real 3-broker Kafka 0.9 whose followers copy at most ~20 KB/s (the cluster of
``test_slow_follower``), the README deployment (isrwatch's topics placed by Kafka),
1 KB messages at 300/s until a follower of the watched topic is said nearing. The load
stops, and the topic is deleted at once: its followers are then megabytes behind and
would stay so for minutes (they copy ~20 KB/s), so nothing but the deletion can resolve
their alerts within the bound below. Every alert of the topic that fired must resolve
within ``RESOLVED_WITHIN_S`` of the deletion, and the job's ``/metrics`` must no longer
show the topic; nor may a real Prometheus scraping the job and the exporter (which forgets
the replicas from the job's tombstones on the state topic): neither series of the topic nor
an alert of the shipped rules for it, within ``PROMETHEUS_CLEAR_S`` of the job's resolution.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.gauges import prometheus_followers, prometheus_scraping
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pipeline import Pipeline, until
from tests.e2e.results import write_result
from tests.e2e.test_slow_follower import HEAVY_RATE, MESSAGE_BYTES, slow_followers_cluster

# The job's forget time is 15 minutes; the collector says gone after ~5 s and three rounds,
# the job resolves with its next batch (a few seconds on a loaded 2-core machine).
RESOLVED_WITHIN_S = 90.0
# The exporter reads the tombstones within a poll, Prometheus scrapes every second and marks
# a series no longer exposed stale at the next scrape; its rules evaluate every second.
PROMETHEUS_CLEAR_S = 60.0
TOPIC = "doomed"


# make campaign (~65 s): make test keeps the collector's gone replicas and the job's forgetting
# by unit test (tests/collector/test_tracker.py, tests/streaming/test_monitor.py).
@pytest.mark.campaign
def test_a_deleted_topic_s_alerts_resolve_within_seconds(kafka_cluster_factory, tmp_path):
    cluster = slow_followers_cluster(kafka_cluster_factory)
    # the watched topic: broker 1 leads, 2 and 3 follow; isrwatch's own topics are placed by
    # Kafka (Pipeline.create_topics)
    cluster.create_topic(TOPIC, assignment=[[1, 2, 3]])
    heavy = ProduceLoad(cluster, TOPIC, 1, rate=HEAVY_RATE, size=MESSAGE_BYTES)
    with Pipeline(cluster, tmp_path) as pipe, contextlib.ExitStack() as stack:
        pipe.wait_watching(2)
        prom = stack.enter_context(prometheus_scraping(pipe, tmp_path))
        until(
            f"Prometheus to show {TOPIC}'s followers",
            lambda: {b for _, b in prometheus_followers(prom.url, TOPIC)["series"]} == {2, 3},
            60,
            pipe,
        )
        heavy.start()
        try:
            until(
                f"a follower of {TOPIC} said nearing",
                lambda: any(e.replica[0] == TOPIC for e in pipe.alerts(AlertName.NEARING.value, "firing")),
                6 * cluster.lag_time_max_ms / 1000,
                pipe,
            )
        finally:
            heavy.stop()
        # The producer goes before the deletion: a client that still knows the topic asks for
        # its metadata, and Kafka 0.9 (auto.create.topics.enable, its default) creates it again
        # within seconds (the soak's producer does: docs/reliability.md). A topic created again
        # lists its replicas again: that is another scenario than this one's deletion.
        heavy.producer = None
        firing = pipe.firing(TOPIC)
        deleted_at = time.time()
        cluster.delete_topic(TOPIC)
        unlisted_at = time.time()
        until(f"{TOPIC}'s alerts to resolve", lambda: not pipe.firing(TOPIC), RESOLVED_WITHIN_S, pipe)
        resolved_at = time.time()
        until(
            f"Prometheus to show nothing of {TOPIC}",
            lambda: not any(prometheus_followers(prom.url, TOPIC).values()),
            PROMETHEUS_CLEAR_S,
            pipe,
        )
        prometheus_clear_at = time.time()
        with urllib.request.urlopen(f"http://127.0.0.1:{pipe.metrics_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        collector_log = pipe.collector.log() if pipe.collector else ""
        job_log = pipe.job_log()
    resolutions = [e for e in pipe.alerts(status="resolved") if e.replica[0] == TOPIC and e.arrived >= deleted_at]
    write_result(
        "deleted_topic",
        {
            "scenario": f"{TOPIC} deleted while its followers' alerts fire ({HEAVY_RATE} msg/s of {MESSAGE_BYTES} B, "
            "followers copying ~20 KB/s)",
            "firing_at_deletion": sorted(name for name, _ in firing),
            "deletion_s": round(unlisted_at - deleted_at, 1),
            "resolved_after_deletion_s": round(resolved_at - deleted_at, 1),
            "prometheus_clear_after_deletion_s": round(prometheus_clear_at - deleted_at, 1),
            "resolutions": [[e.arrived - deleted_at, e.name, *e.replica] for e in resolutions],
        },
    )
    assert firing, f"no alert of {TOPIC} was firing when it was deleted"
    assert {e.identity for e in resolutions} == firing, "every alert firing at the deletion resolves after it"
    assert "event=replicas_gone" in collector_log, "the collector did not say the replicas gone"
    assert "replicas_gone" in job_log
    assert f'topic="{TOPIC}"' not in metrics, f"the job's /metrics still shows {TOPIC}"
