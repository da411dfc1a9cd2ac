"""The rare rows of one raw batch (dead letters, ISR changes, the brokers' counts, the replicas gone, the
clusters' identities) as the job gets them:
``streaming.evaluation.batch.evaluate_records`` on a state table of the test's own."""

from __future__ import annotations

import tempfile
from typing import Any

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import Thresholds
from streaming.evaluation.batch import evaluate_records
from streaming.evaluation.parse import PAYLOAD_KEPT_BYTES
from streaming.evaluation.statetable import StateTable
from streaming.sinks.statewriter import write_batch_state


def rare_rows(
    batch: Any, future_tolerance_ms: int | None, payload_kept_bytes: int = PAYLOAD_KEPT_BYTES
) -> dict[str, list[Any]]:
    """{"deadletters": [...], "isr_changes": [...], "counters": [...], "gone": [...], "identities": [...]}
    of ``batch`` (the Kafka source's columns), each list as ``BatchOutput`` holds it (dicts;
    tuples for the last two). ``payload_kept_bytes``: as the job passes it (``parse.payload_kept_bytes``)."""
    with tempfile.TemporaryDirectory(prefix="isrwatch-rare-") as checkpoint:
        table = StateTable(batch.sparkSession, checkpoint)
        out = evaluate_records(
            batch,
            0,
            table,
            RuleConfig(Rule.KIP16_REFINED, 10_000),
            Thresholds(),
            future_tolerance_ms=future_tolerance_ms,
            max_gap_ms=None,
            payload_kept_bytes=payload_kept_bytes,
        )
        write_batch_state(out, table, 0)
    return {
        "deadletters": out.deadletters,
        "isr_changes": out.isr_changes,
        "counters": out.counters,
        "gone": out.gone,
        "identities": out.identities,
    }
