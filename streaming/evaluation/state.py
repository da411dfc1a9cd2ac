"""The replica key and KIP-16's caught-up time as Spark expressions, and the
aggregation of earlier versions.

Each observation carries the follower's previous observation (``prev_*``), so
``lastCaughtUpTimeMs`` is a plain max over observations
(``isrwatch.rule.observed_caught_up_time``: the broker's rule, with gaps in the
evidence not read as lag): ``caught_up_time_expr``, which the job's per-observation
state (``streaming.evaluation.replicas``) uses.

``replica_aggregates`` is the two-query job's per-replica aggregation (min, max and
``max_by`` over all observations, in Spark's state store): the benchmarks' baseline
(``bench.stages``, ``bench.throughput``'s ceiling), property-tested against the Python
reference like the rest; a checkpoint of that job is read once by
``streaming.lifecycle.query.restore_state``. ``row_to_aggregate`` turns one of its rows into
``isrwatch.status.ReplicaAggregate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, SupportsInt  # Any: a state row (row_to_aggregate)

import pyspark.sql.functions as F
from pyspark.sql import Column

from isrwatch.rule import BY_VERSION, KAFKA_VERSION_PATTERN, Rule, RuleConfig
from isrwatch.status import ReplicaAggregate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "KEY_COLUMNS",
    "LATEST_COLUMNS",
    "caught_up_time_expr",
    "variant_exprs",
    "replica_aggregates",
    "row_to_aggregate",
]

KEY_COLUMNS = ["cluster", "topic", "partition", "broker_id"]

# Taken from the newest observation (max_by t_ms): the state's ``latest`` struct.
LATEST_COLUMNS = (
    "leader_id",
    "leo",
    "leader_leo",
    "hw",
    "isr",
    "replicas",
    "lag_time_max_ms",
    "min_isr",
    "leader_epoch",
    "kafka_version",
)


def caught_up_time_expr(
    rule: Rule,
    max_gap_ms: int | None = None,
    t: Column | None = None,
    leo: Column | None = None,
    leader_leo: Column | None = None,
    prev_t: Column | None = None,
    prev_leader_leo: Column | None = None,
    refined: Column | None = None,
) -> Column:
    """``isrwatch.rule.observed_caught_up_time`` as a Spark expression over the
    observation columns (null where the observation proves nothing), or over the
    columns given. ``max_gap_ms`` None: ``isrwatch.rule.caught_up_time``, the
    broker's rule. ``refined``: per row, whether the rule is ``kip16-refined``
    (``variant_exprs``, ``--rule auto``), for a ``rule`` of either KIP-16 variant."""
    t = F.col("t_ms") if t is None else t
    leo = F.col("leo") if leo is None else leo
    leader_leo = F.col("leader_leo") if leader_leo is None else leader_leo
    prev_t = F.col("prev_t_ms") if prev_t is None else prev_t
    prev_leader_leo = F.col("prev_leader_leo") if prev_leader_leo is None else prev_leader_leo
    at_leader = F.when(leo >= leader_leo, t)
    branches = [at_leader]
    if rule is Rule.KIP16_REFINED or (refined is not None and rule is not Rule.LEGACY_MESSAGES):
        # caught_up_time proves nothing without the leader's answer (leader_leo null).
        previous = leader_leo.isNotNull() & prev_t.isNotNull() & (leo >= prev_leader_leo)
        branches.append(F.when(previous if refined is None else previous & refined, prev_t))
    if max_gap_ms is not None and rule is not Rule.LEGACY_MESSAGES:
        # After a gap, a follower past the pre-gap leader LEO is caught up at t.
        branches.append(F.when(prev_t.isNotNull() & (t - prev_t > max_gap_ms) & (leo >= prev_leader_leo), t))
    # greatest() skips nulls; every branch is <= t_ms (prev_t_ms <= t_ms for valid rows),
    # so the gap branch, where it holds, wins as observed_caught_up_time's early return does.
    return branches[0] if len(branches) == 1 else F.greatest(*branches)


def variant_exprs(cfg: RuleConfig, version: Column) -> tuple[Column, Column]:
    """(refined, idle_is_caught_up) of the rule variant ``isrwatch.rule.chosen_rule`` gives a
    row whose cluster states Kafka ``version`` (a string column, null: not stated), as boolean
    Spark expressions; literals when ``cfg``'s variant was given (``by_version`` false)."""
    refined_default, idle_default = cfg.rule is Rule.KIP16_REFINED, cfg.idle_is_caught_up
    if not cfg.by_version:
        return F.lit(refined_default), F.lit(idle_default)
    known = F.coalesce(version.rlike(f"^{KAFKA_VERSION_PATTERN}\\z"), F.lit(False))
    parts = F.split(version, "\\.")
    ordinal = (  # (major, minor, patch) as one number: each part has at most 4 digits
        F.try_element_at(parts, F.lit(1)).cast("long") * 100_000_000
        + F.try_element_at(parts, F.lit(2)).cast("long") * 10_000
        + F.coalesce(F.try_element_at(parts, F.lit(3)).cast("long"), F.lit(0))
    )
    refined, idle = F.lit(refined_default), F.lit(idle_default)
    for (major, minor, patch), rule, idle_caught_up in reversed(BY_VERSION):  # the newest tested first: outermost
        at_least = known & (ordinal >= major * 100_000_000 + minor * 10_000 + patch)
        refined = F.when(at_least, F.lit(rule is Rule.KIP16_REFINED)).otherwise(refined)
        idle = F.when(at_least, F.lit(idle_caught_up)).otherwise(idle)
    return refined, idle


def replica_aggregates(obs: DataFrame, rule: Rule, max_gap_ms: int | None = None) -> DataFrame:
    """``groupBy(replica).agg(...)``: the columns of ``ReplicaAggregate`` plus
    ``observations`` (how many were aggregated, ever). ``max_gap_ms``: observations
    of a replica further apart than this are a gap in the evidence (None: off).
    What an observation shows only against the replica's previous one (no
    ``prev_*`` fields, a leader change: ``streaming.evaluation.replicas._history_exprs``)
    needs an order this aggregation does not have: the job has it, this baseline not."""
    t = F.col("t_ms")
    caught_up = caught_up_time_expr(rule, max_gap_ms)
    leo = F.col("leo")
    progressed = (leo > F.col("prev_leo")) | (leo >= F.col("leader_leo"))
    latest = F.struct(*[F.col(c) for c in LATEST_COLUMNS])
    return obs.groupBy(*KEY_COLUMNS).agg(
        F.min(t).alias("first_t_ms"),
        F.max(t).alias("last_t_ms"),
        F.max(caught_up).alias("last_caught_up_ms"),
        F.max(F.when(leo.isNotNull(), t)).alias("last_answer_ms"),
        F.max(F.when(F.col("leader_leo").isNotNull(), t)).alias("last_leader_answer_ms"),
        F.max(F.when(progressed, t)).alias("last_progress_ms"),
        F.max_by(latest, t).alias("latest"),
        # max_by ignores rows whose ordering is null: newest non-null value.
        F.max_by(leo, F.when(leo.isNotNull(), t)).alias("known_leo"),
        F.max_by(F.col("leader_leo"), F.when(F.col("leader_leo").isNotNull(), t)).alias("known_leader_leo"),
        F.count(F.lit(1)).alias("observations"),
    )


def row_to_aggregate(row: Mapping[str, Any]) -> ReplicaAggregate:  # Any: a row's ints, lists and dict
    """One output row (as a dict, ``latest`` a dict too) to the core's type."""
    latest = row["latest"] or {}
    leader_id = _int(latest.get("leader_id"))
    return ReplicaAggregate(
        cluster=row["cluster"],
        topic=row["topic"],
        partition=int(row["partition"]),
        broker_id=int(row["broker_id"]),
        first_t_ms=int(row["first_t_ms"]),
        last_t_ms=int(row["last_t_ms"]),
        last_caught_up_ms=_int(row["last_caught_up_ms"]),
        last_answer_ms=_int(row["last_answer_ms"]),
        last_leader_answer_ms=_int(row["last_leader_answer_ms"]),
        last_progress_ms=_int(row["last_progress_ms"]),
        leader_id=-1 if leader_id is None else leader_id,
        leo=_int(latest.get("leo")),
        leader_leo=_int(latest.get("leader_leo")),
        hw=_int(latest.get("hw")),
        isr=tuple(int(b) for b in latest.get("isr") or ()),
        replicas=tuple(int(b) for b in latest.get("replicas") or ()),
        lag_time_max_ms=_int(latest.get("lag_time_max_ms")),
        min_isr=_int(latest.get("min_isr")),
        known_leo=_int(row["known_leo"]),
        known_leader_leo=_int(row["known_leader_leo"]),
        leader_epoch=_int(latest.get("leader_epoch")),
        kafka_version=latest.get("kafka_version"),
    )


def _int(v: SupportsInt | str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):  # NaN from pandas
        return None
