"""The driver's work for one micro-batch (the query's ``foreachBatch``).

``BatchHandler`` has Spark evaluate the batch (``streaming.batch``), moves the
alerts and the statuses through the monitor, writes the batch's dead letters
and ISR-change counts and outcomes (``isrwatch.outcomes``, with the
leaders' own shrink counts) once
(``DriverCheckpoint.save_side``: a batch Spark runs again does not write them
twice), writes the state records (``streaming.statewriter``: by the executors) and the state
version, and logs one line.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from isrwatch.logs import kv
from isrwatch.outcomes import LagEvidence
from isrwatch.rule import RuleConfig
from isrwatch.status import Thresholds
from streaming.batch import BatchOutput, evaluate_records, split_driver_rows
from streaming.variants import RuleVariants

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from exporter.store import StatusStore
    from streaming.checkpoint import DriverCheckpoint
    from streaming.monitor import Monitor
    from streaming.outputs import DeadLetterSink
    from streaming.replicas import StateTable
    from streaming.statewriter import StateWriter

__all__ = ["BatchHandler"]

# The job's logger: operators, the benchmarks and the tests read "streaming.job batch ..." lines.
log = logging.getLogger("streaming.job")

# A cluster's telemetry clock this far ahead of the job's is reported (a collector's clock
# ahead: ages are measured on the collector's clock alone and stay right, but alert times
# are the collector's, clamped to the job's clock for Alertmanager), at most once per period.
CLOCK_AHEAD_WARN_MS = 5_000
CLOCK_WARN_EVERY_S = 600.0
# Evidence that the brokers' replica.lag.time.max.ms is not the job's (isrwatch.outcomes) is
# logged at most once per cluster and direction per period; the metric counts all of it.
LAG_WARN_EVERY_S = 3600.0


@dataclass
class BatchHandler:
    cfg: RuleConfig
    th: Thresholds
    table: StateTable
    monitor: Monitor
    store: StatusStore
    deadletters: DeadLetterSink  # streaming.outputs.DeadLetterFile or KafkaDeadLetters
    checkpoint: DriverCheckpoint
    future_tolerance_ms: int | None
    max_gap_ms: int
    refresh_batches: int
    forget_after_ms: int  # the state table leaves out replicas the monitor forgets
    side_counts: dict[str, int]  # dead letters by reason, for the embedder (JobHandles)
    states: StateWriter | None = None  # the state topic's records (Kafka mode; None: not written)
    side_done: int = field(init=False)  # the last batch whose rare rows were written
    _clock_warned: dict[str, float] = field(init=False, default_factory=dict)  # cluster -> monotonic
    _lag_warned: dict[tuple[str, str], float] = field(init=False, default_factory=dict)  # (cluster, direction)
    # The batch before's replicas observed (estimated: its rows to the driver, times the
    # refresh period) and held: whether this batch evaluates its observed replicas only.
    _observed_before: int = field(init=False, default=0)
    _held_before: int = field(init=False, default=0)
    variants: RuleVariants = field(init=False)  # which rule variant each cluster gets, logged

    def __post_init__(self) -> None:
        self.side_done = self.checkpoint.load_side()
        self.variants = RuleVariants(self.cfg)

    def __call__(self, raw_batch: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        observed_only = self._observed_only()
        out = evaluate_records(
            raw_batch,
            batch_id,
            self.table,
            self.cfg,
            self.th,
            future_tolerance_ms=self.future_tolerance_ms,
            max_gap_ms=self.max_gap_ms,
            # only the periodic refresh (N > 1) reads them: at N = 1 every replica's row goes
            watched_keys=self.monitor.watched_keys() if self.refresh_batches > 1 else frozenset(),
            refresh_batches=self.refresh_batches,
            lookahead=self.monitor.lookahead,
            forget_before=self.monitor.forget_cutoffs(self.forget_after_ms),
            observed_only=observed_only,
            states=self.states,
        )
        try:
            assert out.table is not None
            changes, finals = split_driver_rows(out.table)
            if out.identities:
                self.monitor.identify(out.identities)
                self.variants.stated(out.identities)
            report = self.monitor.apply_statuses(batch_id, finals, changes, out.gone)
            self.variants.seen(report.clusters)
            # the state's next version leaves them out too
            out.gone.extend(report.leading)
            out.gone.extend(report.late)
            self._observed_before, self._held_before = report.rows * self.refresh_batches, report.statuses
            dead = self._write_side(out, batch_id) if batch_id > self.side_done else {}
        finally:
            out.finish()
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

    def _observed_only(self) -> bool:
        """Whether to put only the batch's observed replicas through the window
        (``replicas.split_carried``): when the batch before observed fewer than half the
        replicas held, as a large fleet polled every few triggers does (1M replicas every
        5 s at a 1 s trigger: one in five). Matching the carried rows to the batch's costs
        more than it saves when most replicas are in every batch (docs/benchmarks.md).
        Either way the state and the driver's rows are the same."""
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

    def _warn_lag_time(self, found: LagEvidence) -> None:
        """Say what the brokers did that the job's replica.lag.time.max.ms does not explain
        (Kafka 0.9 shows the brokers' value nowhere), at most once per period."""
        now = time.monotonic()
        if now - self._lag_warned.get((found.cluster, found.direction), -LAG_WARN_EVERY_S) < LAG_WARN_EVERY_S:
            return
        self._lag_warned[(found.cluster, found.direction)] = now
        _, topic, partition, broker = found.replica
        follower, behind_s = f"{topic}-{partition}/{broker}", found.behind_ms / 1000
        if found.direction == "shorter":
            did = f"broker {found.leader} dropped follower {follower} {behind_s:.1f} s after its last catch-up"
        else:
            did = f"broker {found.leader} kept follower {follower} in the ISR {behind_s:.1f} s after its last catch-up"
        evidence = f"{did}; isrwatch uses replica.lag.time.max.ms={found.lag_ms}"
        hint = (
            f"the brokers' replica.lag.time.max.ms is {found.direction} than {found.lag_ms}: set the job's "
            "--lag-time-max-ms and the collector's --lag-time-max-ms to it (docs/kafka.md)"
        )
        log.warning(
            kv(
                event="lag_time_max_ms_mismatch",
                cluster=found.cluster,
                direction=found.direction,
                evidence=f'"{evidence}"',
                hint=f'"{hint}"',
            )
        )

    def _write_side(self, out: BatchOutput, batch_id: int) -> dict[str, int]:
        """Dead letters and ISR change counts of a batch not handled before; by reason."""
        try:  # the sinks log and count what they cannot write; a batch that failed here would fail again
            written = self.deadletters.write(out.deadletters)
        except Exception:
            written = 0
            self.deadletters.failed += len(out.deadletters)
            log.exception("deadletters_lost %s", kv(batch_id=batch_id, count=len(out.deadletters)))
        by_reason: dict[str, int] = {}
        for d in out.deadletters:
            by_reason[d["reason"]] = by_reason.get(d["reason"], 0) + 1
            self.side_counts[d["reason"]] = self.side_counts.get(d["reason"], 0) + 1
        for c in out.isr_changes:
            for change in ("shrink", "expand"):
                if c[change]:
                    self.store.add_isr_changes(c["cluster"], c["topic"], int(c["partition"]), change, int(c[change]))
            # warned or missed: against the alerts of this batch and those before (isrwatch.outcomes)
            cluster, topic, partition = c["cluster"], c["topic"], int(c["partition"])
            where = {"cluster": cluster, "topic": topic, "partition": partition}
            leader = None if c["leader_id"] is None else int(c["leader_id"])
            for broker, outcome, lead_s in self.store.outcomes.isr_change(
                cluster, topic, partition, int(c["t_ms"]), c["left"] or (), c["joined"] or (), leader=leader
            ):
                lead = None if lead_s is None else round(lead_s, 3)
                log.info("isr_shrink %s", kv(**where, broker_id=broker, outcome=outcome, lead_s=lead, t_ms=c["t_ms"]))
        # the leaders' own shrink counts (JMX telemetry): the shrinks metadata did not show
        for n in out.counters:
            self.store.outcomes.leader_count(n["cluster"], int(n["broker_id"]), int(n["t_ms"]), int(n["shrinks_total"]))
        for u in self.store.outcomes.settle(dict(self.monitor.cluster_now)):
            replica = (
                {} if u.replica is None else dict(zip(("topic", "partition", "broker_id"), u.replica[1:], strict=True))
            )
            lead = None if u.lead_s is None else round(u.lead_s, 3)
            # metadata never showed this shrink; the follower is the one whose warning was open (isrwatch.outcomes)
            log.info(
                "isr_shrink %s",
                kv(
                    cluster=u.cluster,
                    **replica,
                    leader_id=u.leader,
                    outcome=u.outcome,
                    lead_s=lead,
                    t_ms=u.t_ms,
                    seen="leader_count",
                ),
            )
        for found in self.store.outcomes.take_evidence():
            self._warn_lag_time(found)
        self.checkpoint.save_side(batch_id)
        if out.deadletters:
            log.warning(
                "deadletters %s", kv(batch_id=batch_id, count=len(out.deadletters), written=written, **by_reason)
            )
        return by_reason
