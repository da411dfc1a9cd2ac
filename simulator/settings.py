"""Settings of ``isrwatch simulate``; the scenario names."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.rule import Rule
from isrwatch.settings import cluster_name, host_ports, option, positive, topic_name

__all__ = ["SCENARIOS", "MODES", "SimulateSettings", "EmbeddedSimulatorSettings"]

SCENARIOS = (
    "steady",
    "burst",
    "low-volume",
    "stuck-follower",
    "slow-follower",
    "bootstrapping-follower",
    "broker-pause",
    "leader-epoch-bump",
)

MODES = ("poll", "fetch")


@dataclass(frozen=True)
class SimulateSettings:
    scenario: str = option("steady", "scenario to simulate", choices=SCENARIOS)
    duration: float = option(60.0, "simulated seconds to run", check=positive)
    speed: float = option(1.0, "simulated seconds per wall-clock second (0 < speed; large for replay)", check=positive)
    seed: int = option(1, "random seed")
    lag_time_max_ms: int = option(10_000, "replica.lag.time.max.ms of the simulated brokers", check=positive)
    rule: str = option(
        Rule.KIP16_REFINED.value,
        "ISR rule the simulated brokers run (their Kafka version)",
        choices=tuple(r.value for r in Rule),
    )
    lag_max_messages: int = option(4000, "replica.lag.max.messages (legacy-messages rule only)", check=positive)
    mode: str = option(
        "poll",
        "telemetry like the collector (poll: every replica each interval) or one observation per fetch",
        choices=MODES,
    )
    interval_ms: int = option(1000, "simulated ms between telemetry rounds", check=positive)
    brokers: int = option(3, "brokers in the simulated cluster", check=positive)
    topics: int = option(2, "topics in the simulated cluster", check=positive)
    partitions: int = option(3, "partitions per topic (replication factor 3, or fewer brokers)", check=positive)
    cluster: str = option("sim", "cluster name in the telemetry", check=cluster_name)
    bootstrap_servers: str | None = option(
        None, "publish telemetry to this Kafka cluster", check=host_ports, metavar="HOSTS"
    )
    kafka_config: list[str] = option([], "librdkafka property KEY=VALUE (repeatable)", metavar="KEY=VALUE")
    telemetry_topic: str = option("isr.telemetry", "telemetry topic", check=topic_name)
    spool_dir: str | None = option(None, "write telemetry to this spool directory instead", metavar="DIR")
    truth_file: str | None = option(
        None, "write the true ISR changes the simulated leaders made (JSON lines)", metavar="FILE"
    )

    def validate(self) -> str | None:
        if self.bootstrap_servers and self.spool_dir:
            return "--bootstrap-servers and --spool-dir exclude each other: pick one destination (neither: stdout)"
        return None


@dataclass(frozen=True)
class EmbeddedSimulatorSettings:
    """The simulator that ``isrwatch run`` embeds when it is given no telemetry source."""

    simulate: str | None = option(
        None,
        "scenario for the embedded simulator (the default source when no --bootstrap-servers)",
        choices=SCENARIOS,
        metavar="SCENARIO",
    )
    speed: float = option(1.0, "embedded simulator speed (1 = real time)", check=positive)
    seed: int = option(1, "embedded simulator random seed")
    cluster: str = option("sim", "cluster name of the embedded simulator", check=cluster_name)
