"""Settings of the streaming job (``JobSettings``) and of where its alerts go
(``AlertingSettings``). ``isrwatch run`` composes them with the exporter's series
options and the embedded simulator's (``isrwatch.commands.RunSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.webconfig import web_config_problem
from isrwatch.clientconfig import kafka_config_problem
from isrwatch.exceptions import ConfigError
from isrwatch.rule import AUTO, Rule
from isrwatch.settings import (
    Secret,
    host_ports,
    http_url,
    http_urls,
    kafka_config_pairs,
    not_empty,
    not_negative,
    option,
    port_number,
    positive,
    topic_name,
)

__all__ = ["JobSettings", "AlertingSettings", "DRIVER_REPLICAS"]

# ``--driver-replicas``: every observed replica's status on the driver, or only those it needs.
DRIVER_REPLICAS = ("all", "not-ok")


def _ratio(v: float) -> str | None:
    return None if 0 < v < 1 else f"{v} must be between 0 and 1"


def _spark_conf(items: list[str]) -> str | None:
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            return f"{item!r} is not spark.KEY=VALUE (for example spark.executor.memory=2g)"
    return None


def _checkpoint_path(v: str | None) -> str | None:
    if v and "://" in v:
        return (
            f"{v} is a URI: the checkpoint must be a path on a filesystem mounted at the same path on the "
            "driver and every worker (local disk in local mode; NFS or the like on a cluster: docs/scaling.md)"
        )
    return None


def _refresh_batches(v: int) -> str | None:
    return None if 1 <= v <= 600 else f"{v} must be from 1 to 600"


@dataclass(frozen=True)
class JobSettings:
    """The job itself: its telemetry source and outputs, the rule, micro-batches, checkpoint, Spark."""

    bootstrap_servers: str | None = option(
        None, "Kafka bootstrap servers of the telemetry topic", check=host_ports, metavar="HOSTS"
    )
    spool_dir: str | None = option(
        None,
        "read telemetry from this spool directory (isrwatch simulate --spool-dir) instead of the embedded simulator",
        check=not_empty,
        metavar="DIR",
    )
    kafka_config: list[str] = option(
        [], "librdkafka property KEY=VALUE for every Kafka client (repeatable)", metavar="KEY=VALUE"
    )
    telemetry_topic: str = option("isr.telemetry", "telemetry topic (input)", check=topic_name)
    state_topic: str = option("isr.replica-state", "replica state topic (output, compacted)", check=topic_name)
    state_writer: str = option(
        "executors",
        "who produces the state topic's records and the dead letters: the Spark executors' Python workers (the "
        "driver takes over what they cannot deliver within 1 s) or the driver alone (executors that cannot reach "
        "the output topics' cluster)",
        choices=("executors", "driver"),
    )
    alerts_topic: str = option("isr.alerts", "alert transitions topic (output)", check=topic_name)
    deadletter_topic: str = option("isr.deadletter", "rejected telemetry topic (output)", check=topic_name)
    # Sized for the default 1 GiB JVM and the collector's records (500 observations, ~36 KB in
    # version 3): ~1M observations a batch. Measured on a backlog of them (docs/kafka.md): 10,000
    # a batch ran the JVM out of heap, 5,000 and 2,000 did not; the old default was 100,000.
    max_records_per_trigger: int = option(
        2_000,
        "most telemetry records read per micro-batch (with a bigger JVM, --spark-conf spark.driver.memory, "
        "more can be read at once); a bad record's dead letter keeps its share of 32 MiB, at most 64 KiB",
        check=positive,
    )
    partition_answer_ms: int = option(
        1000,
        "how long planning a micro-batch waits for each telemetry partition's leader; one that has not "
        "answered is read once it does, so a hung broker never holds the job",
        check=positive,
        metavar="MS",
    )
    starting_offsets: str = option(
        "latest", "where a new checkpoint starts on the telemetry topic", choices=("earliest", "latest")
    )

    rule: str = option(
        AUTO,
        "ISR rule variant: auto picks each cluster's from the Kafka version its telemetry states (kip16 for "
        "0.9-0.10.1, kip16-refined from 0.10.2, a follower at the leader's end never out of sync from 2.1; "
        "kip16-refined where none is stated); a variant given applies to every cluster",
        choices=(AUTO, *(r.value for r in Rule)),
    )
    lag_time_max_ms: int | None = option(
        None,
        "replica.lag.time.max.ms (default: from telemetry, else 10000 simulated / 30000 real)",
        check=positive,
        metavar="MS",
    )
    lag_max_messages: int = option(4000, "replica.lag.max.messages (legacy-messages rule only)", check=positive)
    min_insync_replicas: int = option(1, "min.insync.replicas where telemetry does not say", check=positive)
    nearing_ratio: float = option(0.5, "lag ratio of KafkaReplicaNearingIsrShrink", check=_ratio)
    critical_ratio: float = option(0.8, "lag ratio of KafkaReplicaIsrShrinkImminent", check=_ratio)
    stall_after_ms: int = option(
        3000, "a follower's broker silent this long while its leader moves: stalled", check=positive, metavar="MS"
    )
    stale_after_seconds: float = option(
        15.0, "no telemetry from a cluster this long: IsrwatchTelemetryStale", check=positive
    )
    lookahead_ms: int | None = option(
        None,
        "between micro-batches, a follower behind is said nearing when it crosses nearing-ratio on the job's clock, "
        "inferred at most this far past its newest telemetry (0: off; default: a quarter of replica.lag.time.max.ms, "
        "half for a stalled follower; Kafka telemetry only: docs/streaming.md)",
        check=not_negative,
        metavar="MS",
    )
    telemetry_cluster: str | None = option(
        None,
        "the --cluster name of the watched cluster that also carries the telemetry topic, for a collector "
        "older than the telemetry's endpoints (default: known from the cluster id or the brokers' addresses the "
        "collector states; unknown: the job's own look at its brokers is not used for any watched cluster)",
        metavar="NAME",
    )
    observation_gap_ms: int | None = option(
        None,
        "observations of a replica further apart than this are a gap in the evidence, not time out of sync "
        "(default: half of replica.lag.time.max.ms)",
        check=positive,
        metavar="MS",
    )

    trigger_seconds: float = option(1.0, "micro-batch trigger interval", check=positive)
    ok_refresh_batches: int = option(
        1,
        "refresh a replica that is and was ok (its gauges, its state-topic record) only at its first and then every N-th "
        "observation (with a 1 s poll at a 1 s trigger: every N batches); "
        "replicas not ok, changes of state and followers the lookahead may carry still every batch "
        "(1: every replica every batch); with --driver-replicas not-ok, where ok replicas never reach the driver, "
        "their state-topic records",
        check=_refresh_batches,
        metavar="N",
    )
    driver_replicas: str = option(
        "all",
        "which replicas' statuses the driver holds: all (every observed replica, every batch; the job's /metrics "
        "serve each one) or not-ok (replicas not ok, changing state, without a spare in-sync replica or within "
        "the lookahead's reach; ok replicas stay in Spark and the state topic: the setting for a large fleet, "
        "docs/scaling.md; per-replica series of ok replicas then come from isrwatch exporter)",
        choices=DRIVER_REPLICAS,
    )
    duration: float | None = option(
        None, "stop after this many seconds (default: run until stopped)", check=positive, metavar="SECONDS"
    )
    checkpoint_dir: str | None = option(
        None,
        "Spark checkpoint directory (default: a fresh temporary one on the embedded default, removed when the job ends; with Kafka "
        "$XDG_STATE_HOME/isrwatch/checkpoints/<first bootstrap server>_<telemetry topic>, ~/.local/state without "
        "XDG_STATE_HOME); it records the telemetry it was made for and refuses another",
        check=_checkpoint_path,
        metavar="DIR",
    )
    deadletter_file: str | None = option(
        None,
        "JSON-lines file of rejected telemetry on the embedded default (default: CHECKPOINT_DIR/deadletter.jsonl)",
        metavar="FILE",
    )
    spark_master: str = option(
        "local[2]",
        "Spark master: local[N] in this process, or a cluster's (spark://host:port, yarn, k8s://...; docs/scaling.md)",
    )
    spark_conf: list[str] = option(
        [],
        "Spark property KEY=VALUE for the job's session (repeatable; e.g. spark.executor.memory=2g on a cluster)",
        check=_spark_conf,
        metavar="KEY=VALUE",
    )
    shuffle_partitions: int = option(
        2,
        "spark.sql.shuffle.partitions (the partitions replicas are evaluated and their state written in)",
        check=positive,
    )

    metrics_host: str = option("127.0.0.1", "address of the job's own /metrics")
    metrics_port: int | None = option(
        None,
        "port of the job's own /metrics (default 9743 on the embedded default, 9744 with --bootstrap-servers "
        "so isrwatch exporter can keep 9743; 0: off)",
        check=port_number,
        metavar="PORT",
    )
    web_config_file: str | None = option(
        None,
        "TLS and basic auth for the job's /metrics and /runbook: a Prometheus exporter-toolkit web configuration "
        "file (tls_server_config, basic_auth_users with bcrypt hashes; docs/deploy.md)",
        check=web_config_problem,
        metavar="FILE",
    )

    def validate(self) -> str | None:
        if self.spool_dir and self.bootstrap_servers:
            return "--spool-dir and --bootstrap-servers exclude each other: pick one telemetry source"
        if self.nearing_ratio > self.critical_ratio:
            return f"--nearing-ratio ({self.nearing_ratio}) must not exceed --critical-ratio ({self.critical_ratio})"
        if self.bootstrap_servers:  # the source's planner asks the brokers through kafka-python
            return kafka_config_problem(self.kafka_config)
        try:  # unused without Kafka, but an item that is not KEY=VALUE is a mistake whatever the source
            kafka_config_pairs(self.kafka_config)
        except ConfigError as e:
            return str(e)
        return None


@dataclass(frozen=True)
class AlertingSettings:
    """Where the job's alert transitions go, besides the alerts topic, and what they link to."""

    alertmanager_url: list[str] = option(
        [], "Alertmanager base URL (repeatable, for an HA pair)", check=http_urls, metavar="URL"
    )
    alertmanager_username: str | None = option(None, "basic auth user for Alertmanager")
    alertmanager_password: Secret | None = option(None, "basic auth password for Alertmanager")
    alertmanager_ca_file: str | None = option(None, "CA bundle to verify Alertmanager's TLS certificate")
    alertmanager_insecure: bool = option(False, "do not verify Alertmanager's TLS certificate")
    resend_seconds: float = option(30.0, "re-send firing alerts this often", check=positive)
    grafana_url: str | None = option(None, "Grafana base URL for alerts' generatorURL", check=http_url)
    runbook_url: str | None = option(
        None,
        "runbook base URL (a wiki, or an exporter's http://<host>:<port>/runbook); alerts link to its sections "
        "(default: the job's own /runbook, http://<metrics host>:<metrics port>/runbook, the host name where it "
        "listens on all addresses; with --metrics-port 0, no runbook link)",
        check=http_url,
    )
