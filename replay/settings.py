"""Settings of ``isrwatch replay``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from isrwatch.rule import Rule
from isrwatch.settings import host_ports, option, positive, topic_name
from simulator.settings import MODES, SCENARIOS  # the names only (a cheap module): --simulate is demo wiring

__all__ = ["ReplaySettings", "FORMATS", "DEFAULT_LAG_MAX_MESSAGES", "parse_time_ms", "split_list"]

FORMATS = ("table", "json")
# replica.lag.max.messages' default up to Kafka 0.8.2, the seeds' threshold.
DEFAULT_LAG_MAX_MESSAGES = 4000


def _positive_ints(values: list[str]) -> str | None:
    for v in values:
        try:
            if int(v) <= 0:
                return f"{v} must be > 0"
        except ValueError:
            return f"{v!r} is not a whole number"
    return None


def _rules(values: list[str]) -> str | None:
    for v in values:
        try:
            Rule.parse(v)
        except ValueError as e:
            return str(e)
    return None


def parse_time_ms(value: str | None) -> int | None:
    """``--since`` / ``--until``: epoch milliseconds, or ISO 8601 (UTC when no offset is given)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return int(text)
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return int(stamp.timestamp() * 1000)


def split_list(values: list[str]) -> list[str]:
    """``["10000,30000", "5000"]`` -> ``["10000", "30000", "5000"]`` (flags repeat or take commas)."""
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@dataclass(frozen=True)
class ReplaySettings:
    input: str | None = option(
        None, "recorded telemetry: a spool directory or a file of telemetry records, one per line", metavar="PATH"
    )
    bootstrap_servers: str | None = option(
        None,
        "read the telemetry topic of this Kafka cluster (as the job does), start to end",
        check=host_ports,
        metavar="HOSTS",
    )
    telemetry_topic: str = option("isr.telemetry", "telemetry topic (with --bootstrap-servers)", check=topic_name)
    kafka_config: list[str] = option([], "librdkafka property KEY=VALUE (repeatable)", metavar="KEY=VALUE")
    since: str | None = option(
        None, "replay observations from this time on: ISO 8601 (UTC unless it says) or epoch ms", metavar="TIME"
    )
    until: str | None = option(None, "replay observations up to this time (same forms as --since)", metavar="TIME")
    simulate: str | None = option(
        None, "replay a simulated scenario instead of a recording", choices=SCENARIOS, metavar="SCENARIO"
    )
    duration: float = option(120.0, "simulated seconds (with --simulate)", check=positive)
    seed: int = option(1, "simulator random seed (with --simulate)")
    interval_ms: int = option(200, "simulated ms between telemetry rounds (with --simulate, poll mode)", check=positive)
    mode: str = option(
        "poll",
        "simulated telemetry like the collector (poll) or one observation per follower fetch (with --simulate)",
        choices=MODES,
    )
    rule: list[str] = option(
        [], "rule variant to evaluate (repeatable; default: all three)", check=lambda v: _rules(split_list(v))
    )
    lag_time_max_ms: list[str] = option(
        [],
        "replica.lag.time.max.ms values to evaluate (repeatable or comma-separated; default: the recorded one)",
        check=lambda v: _positive_ints(split_list(v)),
        metavar="MS",
    )
    lag_max_messages: list[str] = option(
        [str(DEFAULT_LAG_MAX_MESSAGES)],
        "replica.lag.max.messages values for the legacy-messages rule (repeatable or comma-separated)",
        check=lambda v: _positive_ints(split_list(v)),
        metavar="N",
    )
    flap_window_ms: int = option(
        10_000,
        "a shrink followed by the replica's expand within this many ms is a flap (a hiccup, not a failure)",
        check=positive,
    )
    format: str = option("table", "output: a table on the terminal, or JSON (one object per setting)", choices=FORMATS)
    report: str | None = option(
        None, "also write an HTML page with the charts to this directory (index.html)", metavar="DIR"
    )
    top: int = option(3, "worst partitions and brokers listed per setting", check=positive)
    spark_master: str = option("local[2]", "Spark master for the replay (batch mode)")

    def validate(self) -> str | None:
        if sum(1 for x in (self.input, self.simulate, self.bootstrap_servers) if x) != 1:
            return "give one recording to replay: --input PATH, --bootstrap-servers HOSTS or --simulate SCENARIO"
        for name, value in (("--since", self.since), ("--until", self.until)):
            try:
                parse_time_ms(value)
            except ValueError:
                return f"{name} {value!r} is not a time: give ISO 8601 (2026-11-24T13:00:00Z) or epoch ms"
        since, until = parse_time_ms(self.since), parse_time_ms(self.until)
        if since is not None and until is not None and since >= until:
            return f"--since {self.since} is not before --until {self.until}"
        return None
