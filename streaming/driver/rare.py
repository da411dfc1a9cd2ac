"""The rare rows of a micro-batch, on the driver: dead letters to their sink, ISR changes to the
store's counters and to ``isrwatch.outcomes`` (each real shrink warned or missed), the leaders'
own shrink counts, and the evidence that the brokers' ``replica.lag.time.max.ms`` is not the
job's, logged. Once per batch: the checkpoint notes the batch handled
(``DriverCheckpoint.save_side``), so a batch Spark runs again does not write them twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from isrwatch.logs import kv

if TYPE_CHECKING:
    from exporter.store import StatusStore
    from isrwatch.outcomes import LagEvidence
    from streaming.driver.checkpoint import DriverCheckpoint
    from streaming.evaluation.batch import BatchOutput
    from streaming.sinks.letterwriter import LetterWriter
    from streaming.sinks.outputs import DeadLetterSink

__all__ = ["RareRows", "LAG_WARN_EVERY_S"]

# The job's logger (its "isr_shrink" and "deadletters" lines, as operators read them).
log = logging.getLogger("streaming.job")

# Evidence that the brokers' replica.lag.time.max.ms is not the job's (isrwatch.outcomes) is
# logged at most once per cluster and direction per period; the metric counts all of it.
LAG_WARN_EVERY_S = 3600.0


@dataclass
class RareRows:
    store: StatusStore
    deadletters: DeadLetterSink  # streaming.sinks.outputs.DeadLetterFile or KafkaDeadLetters
    checkpoint: DriverCheckpoint
    side_counts: dict[str, int]  # dead letters by reason, for the embedder (JobHandles)
    # Kafka mode: the batches' dead letters stay in Spark and the executors write them
    # (BatchOutput.letters); None: they come to the driver (BatchOutput.deadletters)
    letters: LetterWriter | None = None
    _lag_warned: dict[tuple[str, str], float] = field(init=False, default_factory=dict)  # (cluster, direction)

    def write(self, out: BatchOutput, batch_id: int, cluster_now: Mapping[str, int]) -> dict[str, int]:
        """Dead letters and ISR change counts of a batch not handled before (``cluster_now``: each
        cluster's telemetry clock, ``Monitor.cluster_now``); -> its dead letters by reason."""
        by_reason: dict[str, int] = {}
        for d in out.deadletters:
            by_reason[d["reason"]] = by_reason.get(d["reason"], 0) + 1
        # The sinks log and count what they cannot write; a batch that failed here would fail
        # again, so neither write raises past here, nor keeps the other from being made.
        written = 0
        try:
            written = self.deadletters.write(out.deadletters)
        except Exception:
            self.deadletters.failed += len(out.deadletters)
            log.exception("deadletters_lost %s", kv(batch_id=batch_id, count=len(out.deadletters)))
        if out.letters is not None and self.letters is not None:  # counted as the executors write them
            try:
                _, apart, counted = self.letters.write(out.letters)
            except Exception:  # (how many is not known: the write that counts them failed)
                log.exception("deadletters_lost %s", kv(batch_id=batch_id, count="unknown", where="executors"))
            else:
                written += apart
                for reason, times in counted.items():
                    by_reason[reason] = by_reason.get(reason, 0) + times
        for reason, times in by_reason.items():
            self.side_counts[reason] = self.side_counts.get(reason, 0) + times
        count = sum(by_reason.values())
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
        for u in self.store.outcomes.settle(dict(cluster_now)):
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
        if count:
            log.warning("deadletters %s", kv(batch_id=batch_id, count=count, written=written, **by_reason))
        return by_reason

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
