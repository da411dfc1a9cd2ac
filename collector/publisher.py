"""Publishes a round's observations as telemetry records (confluent-kafka producer).

The job folds observations with a ``max``, so their order does not matter and a
record may go to any partition of the telemetry topic. The publisher uses that:
records carry no key, and each goes to a partition chosen round-robin among
those whose leader answers (``PartitionChooser``). A partition is avoided while

* a record sent to it has waited longer than ``stuck_after_s`` for its
  acknowledgement (its leader hangs: SIGSTOP, GC, a full disk), or
* a record to it failed (message timeout, leader unknown), for a back-off that
  doubles up to a minute, or
* its leader, or a replica in its ISR, is a broker the collector's own probe
  found unreachable (only when the telemetry goes to the watched cluster: a
  replicated partition's high watermark stops while a follower in its ISR
  hangs, so a consumer would not see the record until the broker drops it).

A record whose delivery fails is sent again to another partition (at most
``max_resends`` times, then counted as lost); one stuck at a hung leader is
delivered when the leader answers again or fails at ``message.timeout.ms`` and
is re-sent. Duplicates are harmless: the job's aggregation is a max.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from isrwatch.logs import kv
from isrwatch.telemetry import (
    GONE_FROM,
    VERSION,
    BrokerCounters,
    BrokerEndpoint,
    GoneReplica,
    IsrChange,
    Observation,
    TelemetryRecord,
    encode_record,
)

__all__ = ["TelemetryPublisher", "PartitionChooser", "TelemetryPartition", "batch_records", "broker_endpoints"]

log = logging.getLogger(__name__)

# A delivery that fails after this long lets the record go to another partition.
_MESSAGE_TIMEOUT_MS = 15_000
_BACKOFF_S = (2.0, 60.0)
_METADATA_EVERY_S = 5.0


def batch_records(
    cluster: str,
    observations: Sequence[Observation],
    isr_changes: Sequence[IsrChange],
    max_observations: int,
    sent_ms: int | None = None,
    source: str = "fetch",
    brokers: Sequence[BrokerCounters] = (),
    version: int = VERSION,
    gone: Sequence[GoneReplica] = (),
    cluster_id: str | None = None,
    endpoints: Mapping[int, str] | None = None,
    kafka_version: str | None = None,
) -> list[TelemetryRecord]:
    """The round as few records as fit: ``max_observations`` per record, ISR changes, the
    brokers' own counts, the replicas gone and what the collector knows of the cluster
    (``cluster_id``, ``endpoints``: broker id -> ``host:port``) in the first (``version`` 1
    has no place for the counts, versions before 4 none for the gone nor the cluster's
    identity). ``kafka_version``: the cluster's, in every record (version 4; the job reads it
    with each record's observations). ``source``: how the collector read the offsets (``fetch``
    or ``jmx``)."""
    sent = int(time.time() * 1000) if sent_ms is None else sent_ms
    chunks = [observations[i : i + max_observations] for i in range(0, len(observations), max_observations)]
    if not chunks and (isr_changes or brokers or (gone and version >= GONE_FROM)):
        chunks = [[]]
    return [
        TelemetryRecord(
            cluster=cluster,
            source=source,
            sent_ms=sent,
            observations=tuple(chunk),
            isr_changes=tuple(isr_changes) if i == 0 else (),
            brokers=tuple(brokers) if i == 0 else (),
            gone=tuple(gone) if i == 0 else (),
            version=version,
            cluster_id=(cluster_id or None) if i == 0 else None,
            endpoints=broker_endpoints(endpoints or {}) if i == 0 else (),
            kafka_version=kafka_version if version >= GONE_FROM else None,
        )
        for i, chunk in enumerate(chunks)
    ]


def broker_endpoints(brokers: Mapping[int, str]) -> tuple[BrokerEndpoint, ...]:
    """``host:port`` per broker id (the probes' ``brokers``) as the telemetry's endpoints;
    an address that does not read as one is left out."""
    out = []
    for broker_id, address in sorted(brokers.items()):
        host, _, port = address.rpartition(":")
        if host and port.isdigit():
            out.append(BrokerEndpoint(broker_id, host.strip("[]"), int(port)))
    return tuple(out)


@dataclass(frozen=True)
class TelemetryPartition:
    """One partition of the telemetry topic as metadata shows it."""

    partition: int
    leader: int
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()


@dataclass
class PartitionChooser:
    """Which telemetry partition the next record goes to (pure: no Kafka, times passed in)."""

    stuck_after_s: float = 2.0
    partitions: list[TelemetryPartition] = field(default_factory=list)
    # partition -> send time of each record not yet acknowledged, by sequence number
    inflight: dict[int, dict[int, float]] = field(default_factory=dict)
    avoid_until: dict[int, float] = field(default_factory=dict)
    backoff: dict[int, float] = field(default_factory=dict)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def sent(self, partition: int, seq: int, now: float) -> None:
        self.inflight.setdefault(partition, {})[seq] = now

    def acknowledged(self, partition: int, seq: int) -> None:
        self.inflight.get(partition, {}).pop(seq, None)
        self.backoff.pop(partition, None)

    def failed(self, partition: int, seq: int, now: float) -> None:
        self.inflight.get(partition, {}).pop(seq, None)
        wait = min(_BACKOFF_S[1], self.backoff.get(partition, _BACKOFF_S[0] / 2) * 2)
        self.backoff[partition] = wait
        self.avoid_until[partition] = now + wait

    def stuck(self, partition: int, now: float) -> bool:
        waiting = self.inflight.get(partition)
        return waiting is not None and bool(waiting) and now - min(waiting.values()) > self.stuck_after_s

    def healthy(self, now: float, unreachable: Collection[int] = ()) -> list[int]:
        """Partitions worth sending to, best first: those whose leader and ISR all answer, else
        those whose leader answers; never one that is stuck or backing off."""
        usable = [
            p
            for p in self.partitions
            if p.leader >= 0
            and p.leader not in unreachable
            and self.avoid_until.get(p.partition, 0.0) <= now
            and not self.stuck(p.partition, now)
        ]
        clear = [p.partition for p in usable if not set(p.isr) & set(unreachable)]
        return clear or [p.partition for p in usable]

    def choose(self, now: float, unreachable: Collection[int] = (), exclude: int | None = None) -> int | None:
        """The next partition round-robin among the healthy ones; None when there is none
        (the caller lets the producer's own partitioner pick)."""
        good = [p for p in self.healthy(now, unreachable) if p != exclude] or self.healthy(now, unreachable)
        if not good:
            return None
        return good[next(self._turn) % len(good)]


class TelemetryPublisher:
    """Sends telemetry records, spread over the partitions whose leaders answer.

    ``unreachable`` (set by the collector each round) names the watched
    cluster's brokers that did not answer its probe; pass ``same_cluster=False``
    when the telemetry goes to another cluster, whose broker ids mean nothing here.
    """

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        cluster: str,
        *,
        same_cluster: bool = True,
        stuck_after_s: float = 2.0,
        max_resends: int = 5,
    ) -> None:
        self.topic = topic
        self.cluster = cluster
        self.same_cluster = same_cluster
        self.max_resends = max_resends
        # acks=1: the leader's write is enough (telemetry is re-sent every round); waiting for
        # every ISR member would hold each record while a follower hangs.
        self.producer = Producer(
            {
                "linger.ms": 5,
                "compression.type": "none",
                "acks": "1",
                "message.timeout.ms": _MESSAGE_TIMEOUT_MS,
                **config,
            },
            logger=logging.getLogger("librdkafka"),
        )
        self.chooser = PartitionChooser(stuck_after_s=stuck_after_s)
        self.unreachable: set[int] = set()
        self.delivered = 0
        self.resent = 0
        self.failed = 0  # given up after max_resends
        self._seq = itertools.count()
        self._retry: list[tuple[bytes, int, int | None]] = []  # (value, attempts so far, partition it failed on)
        self._metadata_at = 0.0
        self._avoided: frozenset[int] = frozenset()
        self._last_error_log = 0.0

    # -- metadata ---------------------------------------------------------------

    def refresh_partitions(self, timeout_s: float = 1.0, force: bool = False) -> None:
        """The topic's partitions, leaders and ISRs from the producer's metadata (every few seconds)."""
        now = time.monotonic()
        if not force and now - self._metadata_at < _METADATA_EVERY_S:
            return
        self._metadata_at = now
        try:
            md = self.producer.list_topics(self.topic, timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - KafkaException: keep what we knew
            log.debug(kv(event="telemetry_metadata_failed", topic=self.topic, error=str(e)))
            return
        tmd = md.topics.get(self.topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return
        self.chooser.partitions = [
            TelemetryPartition(p.id, p.leader, tuple(p.isrs), tuple(p.replicas))
            for p in sorted(tmd.partitions.values(), key=lambda p: p.id)
        ]

    # -- sending ----------------------------------------------------------------

    def publish(self, records: Sequence[TelemetryRecord]) -> None:
        self.refresh_partitions()
        self.producer.poll(0)  # deliveries first: they free partitions and queue re-sends
        retry, self._retry = self._retry, []
        for value, attempts, failed_on in retry:
            self.resent += 1
            self._send(value, attempts, exclude=failed_on)
        for record in records:
            self._send(encode_record(record), 0)
        self.producer.poll(0)
        self._log_avoided()

    def _send(self, value: bytes, attempts: int, exclude: int | None = None) -> None:
        now = time.monotonic()
        unreachable = self.unreachable if self.same_cluster else ()
        partition = self.chooser.choose(now, unreachable, exclude)
        seq = next(self._seq)

        def on_delivery(err: KafkaError | None, msg: Message, seq: int = seq, attempts: int = attempts) -> None:
            self._on_delivery(err, msg, seq, attempts)

        while True:
            try:
                if partition is None:
                    self.producer.produce(self.topic, value=value, on_delivery=on_delivery)
                else:
                    self.producer.produce(self.topic, value=value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                self.producer.poll(0.1)
        if partition is not None:
            self.chooser.sent(partition, seq, now)

    def _on_delivery(self, err: KafkaError | None, msg: Message, seq: int, attempts: int) -> None:
        partition = msg.partition()
        if err is None:
            self.delivered += 1
            if partition is not None and partition >= 0:
                self.chooser.acknowledged(partition, seq)
            return
        if partition is not None and partition >= 0:
            self.chooser.failed(partition, seq, time.monotonic())
        value = msg.value()
        if attempts < self.max_resends and value is not None:
            self._retry.append((value, attempts + 1, partition))
        else:
            self.failed += 1
        now = time.monotonic()
        if now - self._last_error_log > 10:
            self._last_error_log = now
            log.warning(
                kv(
                    event="telemetry_not_delivered",
                    topic=self.topic,
                    partition=partition,
                    error=err.str(),
                    resending=attempts < self.max_resends,
                    lost=self.failed,
                )
            )

    def _log_avoided(self) -> None:
        now = time.monotonic()
        usable = set(self.chooser.healthy(now, self.unreachable if self.same_cluster else ()))
        avoided = frozenset(p.partition for p in self.chooser.partitions) - usable
        if avoided != self._avoided:
            log.warning(
                kv(
                    event="telemetry_partitions_avoided",
                    topic=self.topic,
                    partitions=",".join(map(str, sorted(avoided))) or "none",
                    using=",".join(map(str, sorted(usable))) or "none",
                )
            )
            self._avoided = avoided

    @property
    def pending(self) -> int:
        """Records produced and not yet acknowledged, plus those waiting to be re-sent."""
        return len(self.producer) + len(self._retry)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for outstanding records (re-sending failed ones); returns how many are still undelivered."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            left = self.producer.flush(max(0.1, min(1.0, deadline - time.monotonic())))
            if self._retry:
                self.publish([])
                continue
            if left == 0:
                return 0
        return self.pending
