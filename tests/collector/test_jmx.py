"""``--source jmx`` flags, JMX endpoints, and the JMX password kept out of every output (no Kafka)."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from concurrent.futures import Future

import pytest

from collector.jmx import BrokerReading, JmxConnection, JmxError, is_replica_log, service_url, start_jvm
from collector.jmxprobe import JmxProbe
from collector.probe import PartitionState
from collector.settings import CollectSettings
from isrwatch.exceptions import ConfigError
from isrwatch.settings import Secret, build, load
from localkafka import free_port

SECRET = "jmx-s3cr3t-pw"
KAFKA = {"bootstrap_servers": "127.0.0.1:9092"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": "jmx"}, r"--source jmx needs --jmx, each broker's JMX endpoint \(for example --jmx kafka1:9999"),
        ({"jmx": ["k1:9999"]}, r"^--jmx needs --source jmx$"),
        ({"jmx_user": "monitor", "jmx_password": Secret(SECRET)}, r"^--jmx-user needs --source jmx$"),
        ({"source": "jmx", "jmx": ["k1:9999"], "jmx_user": "monitor"}, r"--jmx-user and --jmx-password go together"),
        ({"source": "jmx", "jmx": ["k1:9999"], "jmx_password": Secret(SECRET)}, "go together"),
        ({"source": "jmx", "jmx": ["k1"]}, r"--jmx: 'k1' is not host:port or a service:jmx: URL"),
        ({"source": "jmx", "jmx": ["k1:99999"]}, r"'k1:99999' is not host:port"),
        ({"source": "jmx", "jmx": ["k1:9999", "k1:9999"]}, r"--jmx: an endpoint is given twice"),
        (
            {"source": "jmx", "jmx": ["k1:9999"], "jmx_truststore_password": Secret(SECRET)},
            r"--jmx-truststore-password needs --jmx-truststore",
        ),
    ],
)
def test_bad_jmx_options_are_one_clear_message(options, message) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        build(CollectSettings, **KAFKA, **options)
    assert SECRET not in str(caught.value)


def test_source_is_fetch_or_jmx() -> None:
    with pytest.raises(ConfigError, match=r"--source: 'ldap' is not one of: fetch, jmx"):
        load(CollectSettings, argparse.Namespace(source="ldap", **KAFKA), env={})
    assert build(CollectSettings, **KAFKA).source == "fetch"


def test_jmx_settings_from_flags_and_environment_keep_the_password_secret() -> None:
    env = {"ISRWATCH_JMX_PASSWORD": SECRET, "ISRWATCH_JMX": "k1:9999,k2:9999", "ISRWATCH_SOURCE": "jmx"}
    settings = load(
        CollectSettings, None, env={**env, "ISRWATCH_BOOTSTRAP_SERVERS": "k1:9092", "ISRWATCH_JMX_USER": "m"}
    )
    assert settings.jmx == ["k1:9999", "k2:9999"]
    assert isinstance(settings.jmx_password, Secret) and settings.jmx_password.reveal() == SECRET
    assert SECRET not in repr(settings) and SECRET not in str(settings)


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("kafka1:9999", "service:jmx:rmi:///jndi/rmi://kafka1:9999/jmxrmi"),
        (" 10.0.0.7:1099 ", "service:jmx:rmi:///jndi/rmi://10.0.0.7:1099/jmxrmi"),
        ("::1:9999", "service:jmx:rmi:///jndi/rmi://[::1]:9999/jmxrmi"),
        ("service:jmx:rmi:///jndi/rmi://k:7199/jmxrmi", "service:jmx:rmi:///jndi/rmi://k:7199/jmxrmi"),
    ],
)
def test_endpoints_become_jmx_service_urls(endpoint: str, url: str) -> None:
    assert service_url(endpoint) == url


def test_a_closed_jmx_port_fails_with_the_endpoint_and_never_the_password(caplog) -> None:
    start_jvm()
    endpoint = f"127.0.0.1:{free_port()}"
    connection = JmxConnection(endpoint, "monitor", Secret(SECRET))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(JmxError, match=rf"JMX at {endpoint}: .*Connection refused") as caught:
        connection.read()
    assert not connection.connected
    seen = [str(caught.value), repr(connection), caplog.text]
    assert all(SECRET not in text for text in seen)


def test_collect_with_a_bad_jmx_flag_says_so_in_one_line_without_the_password() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "--log-level", "DEBUG", "collect", "--bootstrap-servers", "127.0.0.1:1",
         "--source", "jmx", "--jmx", "k1", "--jmx-user", "monitor", "--jmx-password", SECRET],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "isrwatch collect: error: --jmx: 'k1' is not host:port or a service:jmx: URL "
        "(for example --jmx kafka1:9999 or --jmx service:jmx:rmi:///jndi/rmi://kafka1:9999/jmxrmi)"
    ]
    assert SECRET not in done.stdout + done.stderr


class _Metadata:
    """The metadata side of a round, as a broker answers it (a stand-in: this checks the
    probe's own bookkeeping; tests/collector/test_jmx_kafka.py runs it on real brokers)."""

    def __init__(self) -> None:
        self.partitions: list[PartitionState] = []
        self.brokers: dict[int, str] = {}

    def metadata(self, _timeout_s: float) -> list[PartitionState]:
        return self.partitions


class _Worker:
    """One endpoint's worker: answers as ``broker_id`` while ``answering``, else never."""

    def __init__(self, endpoint: str, broker_id: int) -> None:
        self.connection = JmxConnection(endpoint)
        self.broker_id = broker_id
        self.answering = True
        self.busy = False

    def submit(self) -> Future[BrokerReading]:
        future: Future[BrokerReading] = Future()
        if self.answering:
            self.connection.broker_id = self.broker_id  # what a connection learns when it opens
            future.set_result(BrokerReading(self.broker_id, 1, {("t", 0): 5}))
        else:
            self.busy = True
        return future


def test_a_silent_broker_is_unreachable_even_once_the_metadata_leaves_it_out() -> None:
    # Kafka 0.9 lists only registered brokers among a partition's replicas: a broker hung past
    # its ZooKeeper session drops out of the metadata while it is still hung.
    metadata = _Metadata()
    probe = JmxProbe(metadata, [], round_timeout_s=0.05)  # type: ignore[arg-type]
    workers = [_Worker(f"127.0.0.1:{9990 + b}", b) for b in (1, 2, 3)]
    never = _Worker("127.0.0.1:9999", 4)
    never.answering = False
    probe.workers = [*workers, never]  # type: ignore[list-item]
    metadata.partitions = [PartitionState("t", 0, 1, (1, 2, 3), (1, 2, 3))]
    assert probe.snapshot().unreachable == set()
    workers[2].answering = False
    assert probe.snapshot().unreachable == {3}
    metadata.partitions = [PartitionState("t", 0, 1, (1, 2), (1, 2))]
    for _ in range(2):  # asked again, then still in that read
        assert probe.snapshot().unreachable == {3}
    workers[2].answering, workers[2].busy = True, False
    assert probe.snapshot().unreachable == set()


@pytest.mark.parametrize(
    ("topic", "is_future", "counted"),
    [
        ("orders", None, True),  # a replica's log: leader or follower
        ("orders", "true", False),  # a future log: the replica being copied to another log directory
        ("orders", "false", True),
        ("__cluster_metadata", None, False),  # KRaft's metadata log: no partition of Metadata, no ISR
        ("__consumer_offsets", None, True),  # an internal topic with replicas and an ISR is counted
    ],
)
def test_only_replica_logs_are_read_over_jmx(topic: str, is_future: str | None, counted: bool) -> None:
    """Issue 55, item 5: JMX mode skips `is-future` logs and `__cluster_metadata` (the names of
    Kafka's UnifiedLog metrics, read in its source: no broker here has either)."""
    assert is_replica_log(topic, is_future) is counted
