"""The driver's work for one micro-batch (the query's ``foreachBatch``), in one direction.

``BatchHandler`` has Spark evaluate the batch (``streaming.evaluation.batch``: one Arrow
table), makes its rows statuses (``streaming.driver.rows``) and moves them and the alerts
through the monitor, writes the batch's rare rows once (``streaming.driver.rare``: dead
letters, ISR-change counts and outcomes), then the state records (``streaming.sinks.statewriter``:
by the executors) and the state table's next version (``write_batch_state``), and logs one line.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from isrwatch.logs import kv
from isrwatch.rule import RuleConfig
from isrwatch.status import Thresholds
from streaming.driver.rare import RareRows
from streaming.driver.rows import split_driver_rows
from streaming.driver.variants import RuleVariants
from streaming.evaluation.batch import evaluate_records
from streaming.evaluation.parse import PAYLOAD_KEPT_BYTES
from streaming.sinks.statewriter import write_batch_state

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from exporter.store import StatusStore
    from streaming.driver.checkpoint import DriverCheckpoint
    from streaming.driver.monitor import Monitor
    from streaming.evaluation.statetable import StateTable
    from streaming.sinks.letterwriter import LetterWriter
    from streaming.sinks.outputs import DeadLetterSink
    from streaming.sinks.statewriter import StateWriter

__all__ = ["BatchHandler"]

# The job's logger: operators, the benchmarks and the tests read "streaming.job batch ..." lines.
log = logging.getLogger("streaming.job")

# A cluster's telemetry clock this far ahead of the job's is reported (a collector's clock
# ahead: ages are measured on the collector's clock alone and stay right, but alert times
# are the collector's, clamped to the job's clock for Alertmanager), at most once per period.
CLOCK_AHEAD_WARN_MS = 5_000
CLOCK_WARN_EVERY_S = 600.0


@dataclass
class BatchHandler:
    cfg: RuleConfig
    th: Thresholds
    table: StateTable
    monitor: Monitor
    store: StatusStore
    deadletters: DeadLetterSink  # streaming.sinks.outputs.DeadLetterFile or KafkaDeadLetters
    checkpoint: DriverCheckpoint
    future_tolerance_ms: int | None
    max_gap_ms: int
    refresh_batches: int
    forget_after_ms: int  # the state table leaves out replicas the monitor forgets
    side_counts: dict[str, int]  # dead letters by reason, for the embedder (JobHandles)
    states: StateWriter | None = None  # the state topic's records (Kafka mode; None: not written)
    # --driver-replicas not-ok: the driver takes only the replicas it holds (``Monitor.holds_ok``)
    hold_ok: bool = True
    default_min_isr: int = 1
    # the bytes a dead letter keeps of a big bad record (parse.payload_kept_bytes of the job's cap)
    payload_kept_bytes: int = PAYLOAD_KEPT_BYTES
    # Kafka mode: the executors write the batches' dead letters (streaming.sinks.letterwriter)
    letters: LetterWriter | None = None
    side_done: int = field(init=False)  # the last batch whose rare rows were written
    _clock_warned: dict[str, float] = field(init=False, default_factory=dict)  # cluster -> monotonic
    # The batch before's replicas observed (estimated: its rows to the driver, times the
    # refresh period) and held: whether this batch evaluates its observed replicas only.
    _observed_before: int = field(init=False, default=0)
    _held_before: int = field(init=False, default=0)
    variants: RuleVariants = field(init=False)  # which rule variant each cluster gets, logged
    rare: RareRows = field(init=False)  # the batch's dead letters, ISR changes and leaders' counts

    def __post_init__(self) -> None:
        self.side_done = self.checkpoint.load_side()
        self.variants = RuleVariants(self.cfg)
        self.rare = RareRows(self.store, self.deadletters, self.checkpoint, self.side_counts, self.letters)

    def __call__(self, raw_batch: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        observed_only = self._observed_only()
        # the state table leaves out the replicas older than the monitor's cutoffs as the batch starts
        forget_before = self.monitor.forget_cutoffs(self.forget_after_ms)
        out = evaluate_records(
            raw_batch,
            batch_id,
            self.table,
            self.cfg,
            self.th,
            future_tolerance_ms=self.future_tolerance_ms,
            max_gap_ms=self.max_gap_ms,
            watched_keys=self._watched(),
            refresh_batches=self.refresh_batches,
            lookahead=self.monitor.lookahead,
            observed_only=observed_only,
            hold_ok=self.hold_ok,
            default_min_isr=self.default_min_isr,
            clusters=self.monitor.clusters(),
            payload_kept_bytes=self.payload_kept_bytes,
            letters_apart=self.letters is not None,
        )
        try:
            assert out.table is not None
            changes, finals = split_driver_rows(out.table)
            if out.identities:
                self.monitor.identify(out.identities)
                self.variants.stated(out.identities)
            report = self.monitor.apply_statuses(batch_id, finals, changes, out.gone, out.totals)
            self.variants.seen(report.clusters)
            # the state's next version leaves them out too
            out.gone.extend(report.leading)
            out.gone.extend(report.late)
            if self.hold_ok:
                self._observed_before, self._held_before = report.rows * self.refresh_batches, report.statuses
            else:
                self._observed_before, self._held_before = report.replicas, self.table.full_rows()
            dead = self.rare.write(out, batch_id, self.monitor.cluster_now) if batch_id > self.side_done else {}
        finally:
            write_batch_state(out, self.table, batch_id, forget_before=forget_before, states=self.states)
        elapsed = time.monotonic() - t0
        self.store.health.record_batch(elapsed, report.observations, dead)
        wall_ms = int(time.time() * 1000)
        lag_s = max(((wall_ms - t) / 1000 for t in report.clusters.values()), default=0.0)
        self._check_clocks(report.clusters, wall_ms)
        # The field order is kept: operators and tests parse "batch_id= observations= replicas= states=".
        log.info(
            "batch %s",
            kv(
                batch_id=batch_id,
                observations=report.observations,
                replicas=report.replicas,
                states=report.statuses,
                alerts_started=report.started,
                alerts_resolved=report.resolved,
                deadletters=sum(dead.values()),
                batch_ms=round(elapsed * 1000),
                spark_ms=round(out.spark_s * 1000),
                **{k.replace("_s", "_ms"): round(v * 1000) for k, v in out.stages.items()},
                telemetry_lag_s=float(lag_s),
                changes=len(changes),
                window="observed" if observed_only else "all",
                state_records=out.state_records,
                state_writer=out.state_writer or "none",
            ),
        )

    def _watched(self) -> frozenset[str]:
        """The replicas whose rows Spark must send whatever their state: with ``hold_ok`` off
        every one the driver holds; with the periodic refresh (N > 1) those not ok and the
        lookahead's; none at N = 1 (every observed replica's row goes)."""
        if not self.hold_ok:
            return self.monitor.held_keys()
        return self.monitor.watched_keys() if self.refresh_batches > 1 else frozenset()

    def _observed_only(self) -> bool:
        """Whether to put only the batch's observed replicas through the window
        (``replicas.split_carried``): when the batch before observed fewer than half the
        replicas held, as a large fleet polled every few triggers does (1M replicas every
        5 s at a 1 s trigger: one in five). Matching the carried rows to the batch's costs
        more than it saves when most replicas are in every batch (docs/benchmarks.md).
        Either way the state and the driver's rows are the same. With ``hold_ok`` off the
        driver holds too few replicas to tell: the replicas held are then the state table's
        newest full version's (``StateTable.full_rows``) and those observed Spark's count."""
        return 0 < self._observed_before * 2 < self._held_before

    def _check_clocks(self, clusters: dict[str, int], wall_ms: int) -> None:
        """Warn about a cluster whose telemetry is stamped ahead of the job's clock (not with
        the embedded simulator running faster than real time: no future check there)."""
        if self.future_tolerance_ms is None:
            return
        now = time.monotonic()
        for cluster, t in clusters.items():
            ahead_ms = t - wall_ms
            if (
                ahead_ms > CLOCK_AHEAD_WARN_MS
                and now - self._clock_warned.get(cluster, -CLOCK_WARN_EVERY_S) >= CLOCK_WARN_EVERY_S
            ):
                self._clock_warned[cluster] = now
                log.warning(
                    kv(
                        event="telemetry_clock_ahead",
                        cluster=cluster,
                        ahead_s=round(ahead_ms / 1000, 1),
                        hint="the collector's clock is ahead of the job's: synchronise them (NTP); "
                        "lag ages stay right, alert times are the collector's",
                    )
                )
