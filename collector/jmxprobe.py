"""Polling rounds over JMX (``isrwatch collect --source jmx``): offsets from every broker's
MBeans, leaders and ISRs from metadata.

One :meth:`JmxProbe.snapshot` is one round, the same :class:`~collector.probe.Snapshot` the
fetch probe returns (so the tracker, the telemetry and the job need no second path): each
broker's read (``collector.jmx``) runs on that broker's own worker thread while the round
asks metadata, and the round waits for the reads until its deadline. A broker whose read has
not answered by then, or failed, is unreachable this round, exactly as in fetch mode; the
others carry on. A worker still stuck in a read (a paused broker) gets no new one, so its
broker stays unreachable without a thread piling up per round; a read that answers late is
dropped. A read that never answers fails at the JDK's RMI timeout (``collector.jmx``), which
closes its connection: the next round connects afresh.

Which endpoint is which broker the broker itself says (``kafka.server:type=app-info,id=N``);
a broker of the metadata whose endpoint never answered is unreachable all the same, and so is
a broker whose endpoint answered as it before and is silent now, whatever the metadata says.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

from collector.jmx import BrokerReading, JmxConnection, JmxError, attach_thread, detach_thread, start_jvm
from collector.probe import ClusterProbe, Snapshot
from isrwatch.exceptions import UnreachableError
from isrwatch.logs import kv
from isrwatch.settings import Secret
from isrwatch.telemetry import BrokerCounters

__all__ = ["JmxProbe", "BrokerWorker"]

log = logging.getLogger(__name__)


class BrokerWorker:
    """One broker's JMX connection and the daemon thread, attached to the JVM, that reads it."""

    def __init__(self, connection: JmxConnection) -> None:
        self.connection = connection
        self._jobs: queue.SimpleQueue[Future[BrokerReading] | None] = queue.SimpleQueue()
        self._current: Future[BrokerReading] | None = None
        self._thread = threading.Thread(target=self._run, name=f"jmx-{connection.endpoint}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Still in the previous read (the broker has not answered it yet)."""
        return self._current is not None and not self._current.done()

    def submit(self) -> Future[BrokerReading]:
        future: Future[BrokerReading] = Future()
        self._current = future
        self._jobs.put(future)
        return future

    def stop(self) -> None:
        """Ask the thread to end after its read (:meth:`join` waits for it)."""
        self._jobs.put(None)

    def join(self, timeout_s: float) -> None:
        """Wait for the thread to end; one stuck in a read is left behind (a daemon: it never holds up the exit)."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        attach_thread()
        try:
            while (future := self._jobs.get()) is not None:
                try:
                    future.set_result(self.connection.read())
                except JmxError as e:
                    future.set_exception(e)
        finally:
            self.connection.close()
            detach_thread()


class JmxProbe:
    """Offsets over JMX, leaders and ISRs from ``metadata`` (the fetch probe's Metadata request)."""

    def __init__(
        self,
        metadata: ClusterProbe,
        connections: list[JmxConnection],
        round_timeout_s: float = 1.0,
        truststore: str | None = None,
        truststore_password: Secret | None = None,
    ) -> None:
        self.metadata = metadata
        self.connections = connections
        self.round_timeout_s = round_timeout_s
        self._truststore = (truststore, truststore_password)
        self.workers: list[BrokerWorker] = []
        self.readings: dict[int, BrokerReading] = {}  # the newest per broker
        self._failing: dict[str, str] = {}  # endpoint -> the reason last logged
        self._counters: dict[int, tuple[int | None, int | None, int | None]] = {}

    @property
    def cluster_id(self) -> str | None:
        return self.metadata.cluster_id

    @property
    def kafka_version(self) -> str | None:
        return self.metadata.kafka_version

    def connect(self, timeout_s: float = 15.0) -> Snapshot:
        """Metadata, the JVM, a first round; UnreachableError with one clear line when no JMX endpoint answers."""
        self.metadata.open(timeout_s)
        start_jvm(*self._truststore)
        self.workers = [BrokerWorker(c) for c in self.connections]
        deadline = time.monotonic() + timeout_s
        while True:
            snap = self.snapshot(max(self.round_timeout_s, min(timeout_s, 5.0)))
            if self.readings or time.monotonic() >= deadline:
                break
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if not self.readings:
            reasons = "; ".join(self._failing.values()) or "no answer"
            self.close()
            raise UnreachableError(f"no broker's JMX answered in {timeout_s:.0f} s: {reasons}")
        missing = sorted(set(snap.brokers) - {r.broker_id for r in self.readings.values()})
        if missing:
            log.warning(
                kv(event="jmx_brokers_missing", brokers=",".join(map(str, missing)), endpoints=len(self.workers))
            )
        return snap

    def close(self, timeout_s: float = 1.0) -> None:
        for w in self.workers:
            w.stop()
        deadline = time.monotonic() + timeout_s
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
        self.workers = []
        self.metadata.close()

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        """One polling round: every broker read at once, each given until the round's deadline."""
        started = time.monotonic()
        deadline = started + (timeout_s or self.round_timeout_s)
        asked = {w.connection.endpoint: w.submit() for w in self.workers if not w.busy}
        fresh = self.metadata.metadata(self.round_timeout_s / 2) is not None
        wait_futures(list(asked.values()), timeout=max(0.0, deadline - time.monotonic()))
        readings: dict[int, BrokerReading] = {}
        silent: set[int] = set()  # brokers whose endpoint answered as them before and not this round
        for w in self.workers:
            endpoint = w.connection.endpoint
            future = asked.get(endpoint)
            reason = "still in the previous read" if future is None else "no answer before the round's deadline"
            if future is not None and future.done():
                error = future.exception()
                if error is None:
                    reading = future.result()
                    readings[reading.broker_id] = reading
                    self._recovered(endpoint, reading)
                    continue
                reason = str(error)
            self._failed(endpoint, reason)
            if w.connection.broker_id is not None:
                silent.add(w.connection.broker_id)
        partitions = self.metadata.partitions
        hosted = {b for ps in partitions for b in ps.replicas}
        snap = Snapshot(
            t_ms=max((r.t_ms for r in readings.values()), default=int(time.time() * 1000)),
            brokers=self.metadata.brokers,
            partitions=partitions,
            metadata_fresh=fresh,
        )
        for broker, reading in readings.items():
            for (topic, partition), offset in reading.leo.items():
                snap.leo[(broker, topic, partition)] = offset
            snap.counters.append(BrokerCounters(broker, reading.t_ms, reading.isr_shrinks, reading.isr_expands))
        # A broker the metadata no longer lists (Kafka 0.9 leaves a broker out of a partition's
        # replicas once it is not registered; the probe keeps the replicas it saw before,
        # isrwatch.kafkawire.kept_replicas) is still unreachable when its own endpoint is silent.
        snap.unreachable = (hosted | silent) - set(readings)
        snap.round_s = time.monotonic() - started
        self.readings.update(readings)
        for reading in readings.values():
            self._log_counters(reading)
        return snap

    def _failed(self, endpoint: str, reason: str) -> None:
        if self._failing.get(endpoint) != reason:
            log.warning(kv(event="jmx_unreachable", endpoint=endpoint, reason=reason))
            self._failing[endpoint] = reason

    def _recovered(self, endpoint: str, reading: BrokerReading) -> None:
        if self._failing.pop(endpoint, None) is not None:
            log.info(kv(event="jmx_answering", endpoint=endpoint, broker_id=reading.broker_id))

    def _log_counters(self, r: BrokerReading) -> None:
        """What the broker says about its own replication, logged when it changes."""
        now = (r.isr_shrinks, r.isr_expands, r.under_replicated)
        before = self._counters.get(r.broker_id)
        self._counters[r.broker_id] = now
        if before is not None and before != now:
            log.info(
                kv(
                    event="broker_replication",
                    broker_id=r.broker_id,
                    isr_shrinks_total=r.isr_shrinks,
                    isr_expands_total=r.isr_expands,
                    under_replicated_partitions=r.under_replicated,
                    max_fetcher_lag=r.max_lag,
                )
            )
