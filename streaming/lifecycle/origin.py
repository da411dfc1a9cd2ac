"""What a checkpoint belongs to, and whether its offsets still exist.

A checkpoint holds source offsets, per-replica state and the alert book of one
telemetry stream. Restored against another cluster or topic it is wrong in
every part (offsets out of range, replicas of another fleet, alerts no one
will resolve), so the job records where its telemetry comes from in
``<checkpoint>/isrwatch/origin.json`` at the first start and refuses, with one
clear message, a start against anything else.

Kafka telemetry is identified by its topic and its cluster: the cluster id
where the brokers report one (0.10.1+), otherwise the bootstrap servers (two
lists naming a common broker are the same cluster). ``check_offsets`` then
compares the checkpoint's last offsets with the topic: offsets past a
partition's end (the topic deleted and created again, or its log cut back; or a
new leader's high watermark trailing for a moment) are logged, and the source
reads that partition from its new end if it stays behind (``streaming.sources.source_kafka``);
offsets before its start (retention deleted telemetry the job never read) are
logged with the count and reading resumes at the start.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv

if TYPE_CHECKING:
    from streaming.settings import JobSettings

__all__ = [
    "Origin",
    "check_origin",
    "default_checkpoint_dir",
    "checkpoint_offsets",
    "check_offsets",
    "offsets_past_end",
]

log = logging.getLogger("streaming.origin")

ORIGIN_FILE = "origin.json"
# The job query's directory in the checkpoint (streaming.lifecycle.query.AGG_DIR; the name of
# earlier versions' aggregation query, kept so that an upgraded job keeps its offsets).
QUERY_DIR = "aggregates"


@dataclass(frozen=True)
class Origin:
    source: str  # kafka | spool | simulator
    topic: str | None = None
    bootstrap_servers: tuple[str, ...] = ()
    cluster_id: str | None = None
    spool_dir: str | None = None

    def describe(self) -> str:
        if self.source == "kafka":
            where = f"cluster id {self.cluster_id}" if self.cluster_id else ",".join(self.bootstrap_servers)
            return f"topic {self.topic} on {where}"
        if self.source == "spool":
            return f"spool {self.spool_dir}"
        return "the embedded simulator"

    def same_as(self, other: Origin) -> bool:
        if self.source != other.source:
            return False
        if self.source == "spool":
            return self.spool_dir == other.spool_dir
        if self.source != "kafka":
            return True
        if self.topic != other.topic:
            return False
        if self.cluster_id and other.cluster_id:
            return self.cluster_id == other.cluster_id
        return bool(set(self.bootstrap_servers) & set(other.bootstrap_servers))


def _servers(bootstrap: str) -> tuple[str, ...]:
    return tuple(sorted({s.strip().lower() for s in bootstrap.split(",") if s.strip()}))


def kafka_origin(bootstrap: str, topic: str, cluster_id: str | None) -> Origin:
    return Origin("kafka", topic=topic, bootstrap_servers=_servers(bootstrap), cluster_id=cluster_id)


def default_checkpoint_dir(bootstrap: str, topic: str) -> str:
    """``$XDG_STATE_HOME/isrwatch/checkpoints/<first broker>_<topic>`` (``~/.local/state`` by default):
    absolute, one per telemetry stream, whatever the shell's directory."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{_servers(bootstrap)[0] if bootstrap.strip() else 'kafka'}_{topic}")
    return os.path.join(os.path.abspath(base), "isrwatch", "checkpoints", name)


def recorded_origin(checkpoint_dir: str) -> Origin | None:
    """What the checkpoint was made for (None: nothing recorded yet); ConfigError when unreadable."""
    path = Path(checkpoint_dir) / "isrwatch" / ORIGIN_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        return Origin(**{**recorded, "bootstrap_servers": tuple(recorded.get("bootstrap_servers") or ())})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"--checkpoint-dir {checkpoint_dir}: {path} is unreadable ({e}); move it away") from None


def not_made_for(checkpoint_dir: str, made_for: Origin, origin: Origin) -> str | None:
    """The one-line refusal when a checkpoint made for ``made_for`` is used for ``origin``, else None."""
    if made_for.same_as(origin):
        return None
    return (
        f"--checkpoint-dir {checkpoint_dir} was made for {made_for.describe()}, not {origin.describe()}: "
        f"use another --checkpoint-dir, or delete {checkpoint_dir} to start fresh"
    )


def check_origin(checkpoint_dir: str, origin: Origin) -> None:
    """Record ``origin`` in a new checkpoint; a ConfigError when the checkpoint belongs to another."""
    path = Path(checkpoint_dir) / "isrwatch" / ORIGIN_FILE
    made_for = recorded_origin(checkpoint_dir)
    problem = None if made_for is None else not_made_for(checkpoint_dir, made_for, origin)
    if problem:
        raise ConfigError(problem)
    if made_for is None or (origin.cluster_id and not made_for.cluster_id):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{ORIGIN_FILE}.tmp")
        tmp.write_text(json.dumps(asdict(origin), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)


def checkpoint_offsets(checkpoint_dir: str, query_dir: str) -> dict[str, dict[str, int]] | None:
    """The source offsets of the newest batch in a query's offset log, or None."""
    offsets = Path(checkpoint_dir) / query_dir / "offsets"
    if not offsets.is_dir():
        return None
    batches = sorted((int(n) for n in os.listdir(offsets) if n.isdigit()), reverse=True)
    for batch in batches:
        lines = (offsets / str(batch)).read_text(encoding="utf-8", errors="replace").splitlines()
        # v1, the batch's metadata, then one line of offsets per source
        for line in lines[2:3]:
            try:
                data: object = json.loads(line)
            except ValueError:
                break
            if isinstance(data, dict):
                return {t: {str(p): int(o) for p, o in ps.items()} for t, ps in data.items() if isinstance(ps, dict)}
    return None


def offsets_past_end(
    checkpointed: dict[str, dict[str, int]], high: dict[str, dict[str, int]]
) -> list[tuple[str, str, int, int]]:
    """(topic, partition, checkpoint offset, end) of each partition the checkpoint is past the end
    of: the topic created again or its log cut back (the source reads it from its new end once
    that end stays behind, ``streaming.sources.source_kafka``), or a new leader's trailing high watermark."""
    return [
        (topic, p, off, high[topic][p])
        for topic, parts in checkpointed.items()
        for p, off in parts.items()
        if p in high.get(topic, {}) and off > high[topic][p]
    ]


def check_offsets(
    checkpointed: dict[str, dict[str, int]],
    low: dict[str, dict[str, int]],
    high: dict[str, dict[str, int]],
    checkpoint_dir: str,
) -> None:
    """Log a checkpoint past a partition's end, and what retention deleted unread."""
    for topic, p, off, hi in offsets_past_end(checkpointed, high):
        log.warning(
            kv(
                event="telemetry_checkpoint_past_end",
                topic=topic,
                partition=p,
                checkpoint_offset=off,
                end=hi,
                checkpoint_dir=checkpoint_dir,
                hint="the topic was created again or its log cut back: if the end stays behind, "
                "the job reads the partition from there (telemetry_offsets_went_back)",
            )
        )
    for topic, parts in checkpointed.items():
        for p, off in parts.items():
            lo = low.get(topic, {}).get(p)
            if lo is not None and off < lo:
                log.warning(
                    kv(
                        event="telemetry_deleted_unread",
                        topic=topic,
                        partition=p,
                        checkpoint_offset=off,
                        first_offset=lo,
                        records=lo - off,
                        hint="retention removed them before the job read them; reading resumes at the first offset",
                    )
                )


def check_checkpoint(settings: JobSettings, checkpoint_dir: str, spool_dir: str | None, timeout_s: float) -> str | None:
    """At the job's start: the checkpoint belongs to this telemetry (``settings``), and its
    offsets still exist. Returns the telemetry
    cluster's id, where its brokers give one (``streaming.driver.identity``)."""
    from isrwatch.settings import kafka_config_pairs

    if not settings.bootstrap_servers:
        origin = Origin("spool", spool_dir=os.path.abspath(spool_dir)) if spool_dir else Origin("simulator")
        check_origin(checkpoint_dir, origin)
        return None
    from streaming.sources.source_kafka import describe_topic

    options = {"kafka.bootstrap.servers": settings.bootstrap_servers, "subscribe": settings.telemetry_topic}
    options.update({f"kafka.{k}": v for k, v in kafka_config_pairs(settings.kafka_config).items()})
    cluster_id, low, high = describe_topic(options, settings.telemetry_topic, timeout_s)
    check_origin(checkpoint_dir, kafka_origin(settings.bootstrap_servers, settings.telemetry_topic, cluster_id))
    # The job's one query (an older checkpoint's side/ query no longer runs: its offsets do not matter).
    offsets = checkpoint_offsets(checkpoint_dir, QUERY_DIR)
    if offsets:
        check_offsets(offsets, low, high, checkpoint_dir)
    return cluster_id
