"""The cluster's settings read by DescribeConfigs (collector/main.py, ClusterConfigs) from a protocol-level
fake of a Kafka 4.0 cluster (tests/support/fakebroker.py). A protocol check, not evidence about
a broker's behaviour: the values are what the fake was told to answer. Kafka 0.9 (the real
brokers here) has no DescribeConfigs: tests/collector/test_collector_kafka.py runs the path
that skips it."""

from __future__ import annotations

import logging
import time

import pytest

from collector.main import ClusterConfigs
from collector.probe import ClusterProbe
from collector.tracker import PartitionSettings, ReplicaTracker
from isrwatch.clientconfig import kafka_python_config
from tests.support.fakebroker import FakeKafka, sample_topics

LAGS = {1: 10_000, 2: 12_000, 3: 14_000}


@pytest.fixture
def fake():
    with FakeKafka(sample_topics(("orders", "audit")), lag_time_max_ms=dict(LAGS), min_isr={"orders": 3}) as cluster:
        yield cluster


@pytest.fixture
def probe(fake):
    p = ClusterProbe(kafka_python_config(fake.bootstrap, {}), round_timeout_s=2.0)
    p.open(10.0)
    yield p
    p.close()


def _settings(observations) -> dict[tuple[str, int, int], tuple[int | None, int | None]]:
    return {(o.topic, o.partition, o.broker_id): (o.lag_time_max_ms, o.min_isr) for o in observations}


def test_the_telemetry_carries_the_leaders_lag_and_the_topics_min_isr_as_the_cluster_says(fake, probe) -> None:
    configs = ClusterConfigs(PartitionSettings(None, None))
    configs.refresh(probe, 2.0)
    assert configs.settings.lag_time_max_ms == LAGS
    assert configs.settings.min_isr == {"orders": 3, "audit": 1}  # audit: the brokers' default, the value in effect
    observations = ReplicaTracker(settings=configs.settings).observe(probe.snapshot()).observations
    assert observations
    for o in observations:
        leader = fake.topics[o.topic][o.partition].leader
        assert (o.lag_time_max_ms, o.min_isr) == (LAGS[leader], 3 if o.topic == "orders" else 1)
    assert {(n, v) for _, n, v in fake.asked if n == "DescribeConfigs"} == {("DescribeConfigs", 2)}
    assert fake.refused == [] and fake.unmodelled == []


def test_the_flags_win_over_what_the_cluster_says(fake, probe) -> None:
    only_lag = ClusterConfigs(PartitionSettings(30_000, None))
    only_lag.refresh(probe, 2.0)
    values = set(_settings(ReplicaTracker(settings=only_lag.settings).observe(probe.snapshot()).observations).values())
    assert values == {(30_000, 3), (30_000, 1)}
    both = ClusterConfigs(PartitionSettings(30_000, 2))
    asked = len(fake.asked)
    both.refresh(probe, 2.0)
    assert both.reads == 0 and not any(n == "DescribeConfigs" for _, n, _ in fake.asked[asked:])
    values = set(_settings(ReplicaTracker(settings=both.settings).observe(probe.snapshot()).observations).values())
    assert values == {(30_000, 2)}


def test_a_broker_that_refuses_falls_back_with_one_line_and_holds_no_round(fake, probe, caplog) -> None:
    fake.describe_configs_refused = {2}
    now = [0.0]
    configs = ClusterConfigs(PartitionSettings(None, 2), clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="collector.main"):
        configs.refresh(probe, 2.0)
        now[0] += 300.0  # due again: the same outcome says nothing new
        configs.refresh(probe, 2.0)
    assert configs.reads == 2
    unread = [r.getMessage() for r in caplog.records if "cluster_settings_unread" in r.getMessage()]
    assert len(unread) == 1, caplog.text
    assert "broker 2" in unread[0] and "(--lag-time-max-ms" not in unread[0]
    assert "the job's --lag-time-max-ms, else 30000" in unread[0] and "min_isr=as read" in unread[0]
    assert configs.settings.lag_time_max_ms == {1: 10_000, 3: 14_000}
    assert (2, "DescribeConfigs", 2) in fake.refused
    snap = probe.snapshot()  # the connection the refusal closed is made again
    assert snap.unreachable == set()
    for o in ReplicaTracker(settings=configs.settings).observe(snap).observations:
        leader = fake.topics[o.topic][o.partition].leader
        assert (o.lag_time_max_ms, o.min_isr) == (None if leader == 2 else LAGS[leader], 2)


def test_a_paused_broker_is_waited_for_no_longer_than_the_timeout_and_a_value_read_is_kept(fake, probe) -> None:
    now = [0.0]
    configs = ClusterConfigs(PartitionSettings(None, None), clock=lambda: now[0])
    configs.refresh(probe, 2.0)
    fake.hung = {3}
    fake.lag_time_max_ms[1] = 9_000
    now[0] += 300.0
    started = time.monotonic()
    configs.refresh(probe, 0.5)
    assert time.monotonic() - started < 1.5
    assert configs.settings.lag_time_max_ms == {1: 9_000, 2: 12_000, 3: 14_000}  # broker 3: its earlier answer kept


def test_the_settings_are_read_again_once_the_refresh_time_has_passed(fake, probe) -> None:
    now = [1000.0]
    configs = ClusterConfigs(PartitionSettings(None, None), refresh_s=300.0, clock=lambda: now[0])
    configs.refresh(probe, 2.0)
    fake.lag_time_max_ms[1] = 20_000
    fake.min_isr["audit"] = 2
    now[0] += 299.0
    configs.refresh(probe, 2.0)
    assert configs.reads == 1 and configs.settings.lag_time_max_ms[1] == 10_000
    now[0] += 1.0
    configs.refresh(probe, 2.0)
    assert (
        configs.reads == 2 and configs.settings.lag_time_max_ms[1] == 20_000 and configs.settings.min_isr["audit"] == 2
    )
