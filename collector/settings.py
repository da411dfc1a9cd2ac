"""Settings of ``isrwatch collect``."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.clientconfig import kafka_config_problem
from isrwatch.settings import Secret, cluster_name, host_ports, option, positive, topic_name
from isrwatch.telemetry import SUPPORTED_VERSIONS, VERSION

__all__ = ["CollectSettings", "SOURCES"]

# How the collector reads offsets; also the telemetry records' ``source`` (docs/telemetry.md).
SOURCES = ("fetch", "jmx")


@dataclass(frozen=True)
class CollectSettings:
    bootstrap_servers: str | None = option(
        None, "bootstrap servers of the cluster to watch (required)", check=host_ports, metavar="HOSTS"
    )
    kafka_config: list[str] = option(
        [], "librdkafka property KEY=VALUE for every Kafka client (repeatable)", metavar="KEY=VALUE"
    )
    telemetry_bootstrap_servers: str | None = option(
        None, "publish telemetry to this cluster instead of the watched one", check=host_ports, metavar="HOSTS"
    )
    telemetry_kafka_config: list[str] = option(
        [],
        "librdkafka property KEY=VALUE for the telemetry cluster's producer, over --kafka-config "
        "(with --telemetry-bootstrap-servers; repeatable)",
        metavar="KEY=VALUE",
    )
    telemetry_topic: str = option("isr.telemetry", "telemetry topic", check=topic_name)
    interval: float = option(1.0, "seconds between polling rounds (sub-second allowed)", check=positive)
    cluster: str = option("default", "cluster name written into the telemetry", check=cluster_name)
    duration: float | None = option(None, "stop after this many seconds", check=positive, metavar="SECONDS")
    lag_time_max_ms: int | None = option(
        None,
        "replica.lag.time.max.ms written into the telemetry, over what the brokers say (default: each partition's "
        "leader's, read by DescribeConfigs from Kafka 0.11; else none, the job's own applies)",
        check=positive,
        metavar="MS",
    )
    min_insync_replicas: int | None = option(
        None,
        "min.insync.replicas written into the telemetry, over what the cluster says (default: each topic's, read by "
        "DescribeConfigs from Kafka 0.11; else none, the job's own applies)",
        check=positive,
        metavar="N",
    )
    round_timeout: float | None = option(
        None,
        "seconds a round waits for brokers' answers before it calls one unreachable (default: max(interval, 0.5))",
        check=positive,
        metavar="SECONDS",
    )
    startup_timeout: float = option(
        15.0, "seconds to reach the cluster at start-up before giving up", check=positive, metavar="SECONDS"
    )
    max_observations_per_record: int = option(
        500, "observations batched into one telemetry record", check=positive, metavar="N"
    )
    telemetry_version: int = option(
        VERSION,
        f"telemetry format written: {VERSION} (observations as columns, the replicas gone) or an older one for a job that does not "
        f"read {VERSION} yet (docs/telemetry.md, Compatibility)",
        check=lambda v: (
            None if v in SUPPORTED_VERSIONS else f"must be one of {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))}"
        ),
        metavar="N",
    )
    source: str = option(
        "fetch",
        "how offsets are read: fetch (ListOffsets to every broker) or jmx (every broker's MBeans over JMX remote, "
        "one endpoint per broker with --jmx); leaders and ISRs come from metadata either way",
        choices=SOURCES,
    )
    jmx: list[str] = option(
        [],
        "a broker's JMX endpoint: host:port (its com.sun.management.jmxremote.port) or a service:jmx:rmi: URL; "
        "one per broker (repeatable; with --source jmx)",
        metavar="ENDPOINT",
    )
    jmx_user: str | None = option(None, "JMX remote user (com.sun.management.jmxremote.authenticate)", metavar="USER")
    jmx_password: Secret | None = option(None, "JMX remote password (with --jmx-user)", metavar="PASSWORD")
    jmx_registry_ssl: bool = option(
        False, "the brokers' RMI registry uses TLS too (com.sun.management.jmxremote.registry.ssl=true)"
    )
    jmx_truststore: str | None = option(
        None,
        "Java truststore (javax.net.ssl.trustStore) with the CA of brokers whose JMX uses TLS "
        "(com.sun.management.jmxremote.ssl=true)",
        metavar="FILE",
    )
    jmx_truststore_password: Secret | None = option(
        None, "password of --jmx-truststore (javax.net.ssl.trustStorePassword)", metavar="PASSWORD"
    )

    def validate(self) -> str | None:
        if not self.bootstrap_servers:
            return "--bootstrap-servers is required (for example --bootstrap-servers kafka1:9092,kafka2:9092)"
        if self.telemetry_kafka_config and not self.telemetry_bootstrap_servers:
            return "--telemetry-kafka-config needs --telemetry-bootstrap-servers (the telemetry cluster it configures)"
        # the probe asks the watched cluster through kafka-python
        return kafka_config_problem(self.kafka_config) or self._jmx_problem()

    def _jmx_problem(self) -> str | None:
        jmx_options = {
            "--jmx": bool(self.jmx),
            "--jmx-user": self.jmx_user is not None,
            "--jmx-password": self.jmx_password is not None,
            "--jmx-registry-ssl": self.jmx_registry_ssl,
            "--jmx-truststore": self.jmx_truststore is not None,
            "--jmx-truststore-password": self.jmx_truststore_password is not None,
        }
        if self.source != "jmx":
            given = [flag for flag, set_ in jmx_options.items() if set_]
            return f"{given[0]} needs --source jmx" if given else None
        if not self.jmx:
            return (
                "--source jmx needs --jmx, each broker's JMX endpoint "
                "(for example --jmx kafka1:9999 --jmx kafka2:9999 --jmx kafka3:9999)"
            )
        if (self.jmx_user is None) != (self.jmx_password is None):
            return "--jmx-user and --jmx-password go together (the JMX remote credentials)"
        if self.jmx_truststore_password is not None and self.jmx_truststore is None:
            return "--jmx-truststore-password needs --jmx-truststore"
        for endpoint in self.jmx:
            problem = endpoint_problem(endpoint)
            if problem:
                return problem
        if len(set(self.jmx)) != len(self.jmx):
            return f"--jmx: an endpoint is given twice ({', '.join(sorted(self.jmx))})"
        return None


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not ``host:port`` or a ``service:jmx:`` URL; None when it is one."""
    text = endpoint.strip()
    if text.startswith("service:jmx:"):
        return None
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536:
        return None
    return (
        f"--jmx: {endpoint!r} is not host:port or a service:jmx: URL "
        "(for example --jmx kafka1:9999 or --jmx service:jmx:rmi:///jndi/rmi://kafka1:9999/jmxrmi)"
    )
