"""Shared fixtures: the real local Kafka 0.9 cluster.

Nothing starts unless a test asks for ``kafka_cluster`` (one cluster for the
whole session, default broker settings) or ``kafka_cluster_factory`` (a fresh
cluster per call, with the broker settings the test needs, e.g. a short
``replica.lag.time.max.ms`` and a long ZooKeeper session for pause tests).
Test tiers (markers): ``kafka`` (a real Kafka cluster: added to every test that uses
either fixture), ``spark`` (a real Spark: added to every test that uses the ``spark``
fixture; modules that start the job another way say ``pytestmark = pytest.mark.spark``),
``services`` (a real Prometheus or Alertmanager, said by the module). Any of the three
makes a test ``integration``; ``make test-unit`` runs the others. The long tests left out of
``make test`` carry ``campaign`` where they are defined, with a line saying why.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

KAFKA_FIXTURES = {"kafka_cluster", "kafka_cluster_factory"}

# The shared cluster: a generous ZooKeeper session so a loaded CI machine does not
# lose brokers; tests that inject faults make their own cluster.
SHARED_BROKER_SETTINGS: dict[str, Any] = {
    "replica.lag.time.max.ms": 10_000,
    "zookeeper.session.timeout.ms": 30_000,
}


TIERS = ("kafka", "spark", "services")
TIER_FIXTURES = {"kafka": KAFKA_FIXTURES, "spark": {"spark", "bench_spark"}}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for tier, names in TIER_FIXTURES.items():
            if fixtures & names:
                item.add_marker(getattr(pytest.mark, tier))
        if any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[Any]:
    """A started 3-broker LocalKafka shared by the session (create fresh topics with ``unique_name``)."""
    from localkafka import LocalKafka

    with LocalKafka(brokers=3, broker_settings=SHARED_BROKER_SETTINGS) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _shared_cluster_left_in_sync(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the shared ``kafka_cluster`` leaves it as it found it, so that no fault of one
    test reaches the next: every broker resumed and running, every partition led and its ISR
    back to all its replicas. (A test with a cluster of its own needs nothing: it is closed.)"""
    cluster = request.getfixturevalue("kafka_cluster") if "kafka_cluster" in request.fixturenames else None
    yield
    if cluster is not None:
        restore_in_sync(cluster)


def restore_in_sync(cluster: Any, timeout_s: float = 120.0) -> None:
    """Resume every broker (SIGCONT: nothing for a running one), start a stopped one, and wait
    until every partition of every topic has a leader and all its replicas in its ISR."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    for b in cluster.broker_ids:
        if cluster.running(b):
            cluster.resume(b)
        else:
            cluster.start_broker(b)
    admin = AdminClient(cluster.client_config())
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            topics = admin.list_topics(timeout=10).topics
            behind = [
                f"{t}-{p} isr={part.isrs} replicas={part.replicas} leader={part.leader}"
                for t, meta in topics.items()
                for p, part in meta.partitions.items()
                if part.leader < 0 or set(part.isrs) != set(part.replicas)
            ]
        except KafkaException as e:  # a broker just started may not answer metadata yet
            behind = [f"metadata: {e}"]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the shared cluster not back in sync after {timeout_s:g} s: {behind[:5]}")
        time.sleep(0.5)


@pytest.fixture
def kafka_cluster_factory() -> Iterator[Callable[..., Any]]:
    """``make(brokers=3, controller=1, **broker_settings)`` -> a started LocalKafka, stopped after the test.

    Broker setting names use underscores for dots:
    ``make(replica_lag_time_max_ms=4000, zookeeper_session_timeout_ms=60000)``.
    """
    from localkafka import LocalKafka

    made: list[Any] = []

    def make(brokers: int = 3, controller: int = 1, **settings: Any) -> Any:
        cluster = LocalKafka(
            brokers=brokers,
            controller=controller,
            broker_settings={k.replace("_", "."): v for k, v in settings.items()},
        )
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("orders")`` -> a topic/group name no other test uses."""

    def make(prefix: str) -> str:
        return f"{prefix}-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A SparkSession shared by the session (local mode, started once): the job's
    expressions (tests/streaming) and the replay (tests/replay)."""
    from streaming.lifecycle.session import build_session

    session = build_session("local[2]", 2, app_name="isrwatch-tests")
    yield session
    session.stop()
