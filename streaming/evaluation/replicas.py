"""Per-replica state across micro-batches, and the rule at every observation.

The state is one row per follower replica: the columns of
``isrwatch.status.ReplicaAggregate`` (``STATE_COLUMNS``), plus the times
that pick its newest values (``latest_t``, ``known_leo_t``,
``known_leader_leo_t``) and ``observations``. ``StateTable`` keeps it in the
checkpoint as one Parquet version per micro-batch (``<checkpoint>/replicas/``:
the whole table, or a delta of the replicas the batch observed), written before
the batch commits: a batch Spark runs again after a crash reads the versions
before it and rewrites its own, so a replay gives the same state.

``evaluate_batch`` is the job's hot path, all in the JVM. Each replica's
carried row (the "seed") goes in front of the batch's observations of it;
a running aggregate over the replica in time order (window functions, the
same min / max / max_by the state is made of) is the state as of every
observation, and ``streaming.evaluation.evaluate.status_columns`` evaluates each one.
So a fault that begins and ends between two batch ends is seen, with the
telemetry times it began and ended (docs/rule.md, "Within a batch"): a row
whose state differs from the row before it is a *change*, and only changes,
plus each replica's last row, leave Spark.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

import pyspark.sql.functions as F
from pyspark.sql import Column, Window

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import State, Thresholds
from streaming.evaluation import evaluate, projection
from streaming.evaluation.state import KEY_COLUMNS, LATEST_COLUMNS, caught_up_time_expr, variant_exprs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, WindowSpec

    from streaming.evaluation.evaluate import Reach

__all__ = [
    "STATE_COLUMNS",
    "observation_rows",
    "observed_keys",
    "split_carried",
    "next_state",
    "evaluate_batch",
    "for_the_driver",
    "held_for_the_driver",
    "totals_exprs",
    "count_totals",
    "newest_times",
]

log = logging.getLogger("streaming.replicas")


STATE_COLUMNS = [
    *KEY_COLUMNS,
    "first_t_ms",
    "last_t_ms",
    "last_caught_up_ms",
    "last_answer_ms",
    "last_leader_answer_ms",
    "last_progress_ms",
    "latest",
    "latest_t",
    "known_leo",
    "known_leo_t",
    "known_leader_leo",
    "known_leader_leo_t",
    "observations",
    "out_of_sync_episodes",  # times the lag state entered out_of_sync, ever
]

# Running aggregates over a replica's rows, by state column: how two rows combine.
_MIN, _MAX, _SUM = "min", "max", "sum"
_BY = {  # max_by(column, its time)
    "latest": "latest_t",
    "known_leo": "known_leo_t",
    "known_leader_leo": "known_leader_leo_t",
}
_COMBINE = {
    "first_t_ms": _MIN,
    "last_t_ms": _MAX,
    "last_caught_up_ms": _MAX,
    "last_answer_ms": _MAX,
    "last_leader_answer_ms": _MAX,
    "last_progress_ms": _MAX,
    "latest_t": _MAX,
    "known_leo_t": _MAX,
    "known_leader_leo_t": _MAX,
    "observations": _SUM,
    "out_of_sync_episodes": _SUM,  # the seed's count (observations add 0; evaluate_batch counts entries)
}

# Driver-bound flag columns of evaluate_batch's output.
CHANGE, LAST, SEED = "_change", "_last", "_seed"
# The replica's observations in the batch (``observations`` is the total, the batch's included).
IN_BATCH = evaluate.IN_BATCH
PREV_OBSERVED = evaluate.PREV_OBSERVED
# An observation row's flag: the collector sent no ``prev_*`` fields with it.
NO_PREV = "_no_prev"
# A driver's row's flag: the driver holds its replica (``held_for_the_driver``).
_HELD = "_held"


def observation_rows(obs: DataFrame, cfg: RuleConfig, max_gap_ms: int | None) -> DataFrame:
    """``parse.good_observations`` -> one state-shaped row per observation (what
    the observation alone says), ``_seed`` 0, and ``_no_prev``."""
    return projection.select(obs, *_observation_exprs(cfg, max_gap_ms))


# The expressions below are built once (functools caches): each Column costs calls
# into the JVM, and rebuilt every batch they took about a second of it.


@functools.lru_cache(maxsize=8)
def _observation_exprs(cfg: RuleConfig, max_gap_ms: int | None) -> list[Column]:
    # --rule auto: the refined branch per row, by the Kafka version its record states
    refined = variant_exprs(cfg, F.col("kafka_version"))[0] if cfg.by_version else None
    t = F.col("t_ms")
    leo, leader_leo = F.col("leo"), F.col("leader_leo")
    progressed = (leo > F.col("prev_leo")) | (leo >= leader_leo)
    return [
        *[F.col(c) for c in KEY_COLUMNS],
        t.alias("first_t_ms"),
        t.alias("last_t_ms"),
        caught_up_time_expr(cfg.rule, max_gap_ms, refined=refined).alias("last_caught_up_ms"),
        F.when(leo.isNotNull(), t).alias("last_answer_ms"),
        F.when(leader_leo.isNotNull(), t).alias("last_leader_answer_ms"),
        F.when(progressed, t).alias("last_progress_ms"),
        F.struct(*[F.col(c) for c in LATEST_COLUMNS]).alias("latest"),
        t.alias("latest_t"),
        leo.alias("known_leo"),
        F.when(leo.isNotNull(), t).alias("known_leo_t"),
        leader_leo.alias("known_leader_leo"),
        F.when(leader_leo.isNotNull(), t).alias("known_leader_leo_t"),
        F.lit(1).cast("long").alias("observations"),
        F.lit(0).cast("long").alias("out_of_sync_episodes"),
        F.lit(0).alias(SEED),
        F.col("prev_t_ms").isNull().alias(NO_PREV),
    ]


def _running(column: str, window: WindowSpec) -> Column:
    if column in _BY:
        # max_by skips rows whose ordering is null: the newest non-null value.
        return F.max_by(F.col(column), F.col(_BY[column])).over(window)
    how = _COMBINE[column]
    fn = F.min if how == _MIN else F.max if how == _MAX else F.sum
    return fn(F.col(column)).over(window)


def _signature(state: Column, lag_state: Column) -> Column:
    """What the alerts of a replica follow: its state and its lag state."""
    return F.concat_ws("|", state, lag_state)


_STATE_VALUES = [c for c in STATE_COLUMNS if c not in KEY_COLUMNS]
_HELPERS = ("_i", "_n", "_m")
_ENTERED = "_entered"
_PEAK = "_peak"  # the batch's largest lag ratio so far: the status's peak_lag_ratio
_OUT_OF_SYNC = State.OUT_OF_SYNC.value
# What every row needs of its status: the two states its changes follow, and the ratio of its peak.
_PER_ROW = ("state", "lag_state", "lag_ratio")


@functools.lru_cache(maxsize=8)
def _history_exprs(cfg: RuleConfig, max_gap_ms: int | None) -> list[Column]:
    """evaluate_batch's rows with ``last_caught_up_ms`` raised by what an
    observation shows against the replica's previous one in the job's state (the
    newest row before it: the seed's ``latest`` or an earlier observation), which
    the observation alone cannot:

    * an observation without the collector's ``prev_*`` fields (the collector did
      not see the replica as a follower in its previous round: it led the
      partition, or the collector restarted) is judged against the state's previous
      observation instead (``isrwatch.episodes.fold``), the gap rule included;
    * an observation under another leader than the previous one's, or under a newer
      leader epoch of the same leader (both epochs known), is evidence of a catch-up
      (``isrwatch.rule.new_leadership``, ``isrwatch.rule.leader_change_caught_up_time``);
    * an observation without ``prev_*`` long after the state's previous one, whose
      broker did not answer, starts the replica's evidence afresh
      (``isrwatch.rule.unseen_gap_caught_up_time``).

    Both only for an observation newer than the previous one, whose time each row also
    carries (``evaluate.PREV_OBSERVED``, null for the seed and an observation no newer than
    the row before it): the driver's lookahead tells a follower polled now and then from one
    that stopped by it (``streaming.driver.lookahead.kept_up``).
    """
    rule = cfg.rule
    before = _ordered().rowsBetween(Window.unboundedPreceding, -1)
    latest = F.col("latest")
    refined = variant_exprs(cfg, latest["kafka_version"])[0] if cfg.by_version else None
    t, leader = F.col("latest_t"), latest["leader_id"]
    prev_t = F.max(t).over(before)
    prev_leader = F.max_by(leader, t).over(before)
    epoch, prev_epoch = latest["leader_epoch"], F.max_by(latest["leader_epoch"], t).over(before)
    prev_leader_leo = F.max_by(F.col("known_leader_leo"), F.col("known_leader_leo_t")).over(before)
    newer = (F.col(SEED) == 0) & (prev_t < t)
    filled = caught_up_time_expr(
        rule, max_gap_ms, t, latest["leo"], latest["leader_leo"], prev_t, prev_leader_leo, refined
    )
    # An ISR not reported (null or empty, as the evaluation reads it) does not rule the follower out.
    isr = F.coalesce(latest["isr"], F.array().cast("array<int>"))
    in_isr = (F.size(isr) == 0) | F.array_contains(isr, F.col("broker_id"))
    # isrwatch.rule.new_leadership: another leader, or the same one in a newer epoch (both known)
    new_epoch = F.coalesce((leader == prev_leader) & (prev_epoch >= 0) & (epoch > prev_epoch), F.lit(False))
    changed = (prev_leader >= 0) & (leader >= 0) & ((leader != prev_leader) | new_epoch) & in_isr
    after_gap = t - prev_t > max_gap_ms if max_gap_ms is not None else F.lit(False)
    # isrwatch.rule.unseen_gap_caught_up_time: no prev_*, a gap, no answer from the broker
    unseen_gap = F.lit(False) if rule is Rule.LEGACY_MESSAGES else after_gap & latest["leo"].isNull()
    # greatest() skips nulls: the observation's own evidence stays where these prove nothing.
    lcu = F.greatest(
        F.col("last_caught_up_ms"),
        F.when(newer & F.col(NO_PREV), filled),
        F.when(newer & F.col(NO_PREV) & unseen_gap, t),
        F.when(newer & changed, F.when(after_gap, t).otherwise(prev_t)),
    )
    columns = [lcu.alias(c) if c == "last_caught_up_ms" else F.col(c) for c in [*STATE_COLUMNS, SEED, *_ORDER]]
    return [*columns, F.when(newer, prev_t).alias(PREV_OBSERVED)]


# The order of a replica's rows, copied from the row's own values before the window
# (the running pass replaces those columns by running values): every window pass
# orders by the same untouched columns, so Spark sorts the rows once, not again after
# the running pass, and every pass sees the rows in the same order.
_ORDER_BY = {"_o_t": "latest_t", "_o_leo_t": "known_leo_t", "_o_leo": "known_leo", "_o_leader_leo": "known_leader_leo"}
_ORDER = tuple(_ORDER_BY)


_VALUES = (*KEY_COLUMNS, *_STATE_VALUES, SEED, *_ORDER, PREV_OBSERVED)
_JUDGED_KEEP = (*_VALUES, *_HELPERS)
_COUNTED = (*[c for c in _VALUES if c != "out_of_sync_episodes"], CHANGE, LAST, IN_BATCH, _PEAK)
_FULL_KEEP = (*_STATE_VALUES, SEED, CHANGE, LAST, IN_BATCH, _PEAK)


@functools.cache
def _order_columns() -> list[Column]:
    """The ordering's copies of the state values (``_ORDER_BY``), taken before the window."""
    return [F.col(v).alias(k) for k, v in _ORDER_BY.items()]


@functools.cache
def _with_batch_peak() -> list[Column]:
    """evaluate_batch's last projection: the full status's columns (``evaluate.status_columns``
    with ``_FULL_KEEP``) with the batch's peak in place of the single row's, under its name
    (statuses_from_arrow reads by name)."""
    names = [*evaluate.STATUS_COLUMNS, *evaluate.EXTRA_COLUMNS]
    names += [k for k in _FULL_KEEP if k not in names and k != _PEAK]
    return [F.col(_PEAK).alias(c) if c == "peak_lag_ratio" else F.col(c) for c in names]


@functools.cache
def _ordered() -> WindowSpec:
    """A replica's rows in order: the seed first, then the observations in
    telemetry time order (ties broken by content, so a replayed batch orders
    its rows the same way)."""
    return Window.partitionBy(*KEY_COLUMNS).orderBy(F.col(SEED).desc(), *[F.col(c) for c in _ORDER])


@functools.cache
def _batch_exprs() -> tuple[list[Column], list[Column], list[Column], list[Column]]:
    """(seed columns, running columns, flag columns, episode columns) of evaluate_batch."""
    seeds = [*[F.col(c) for c in STATE_COLUMNS], F.lit(1).alias(SEED), F.lit(False).alias(NO_PREV)]
    ordered = _ordered()
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # The whole replica, in the same window specification as the running values (one pass).
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    running = [
        *[F.col(c) for c in KEY_COLUMNS],
        *[_running(c, upto).alias(c) for c in _STATE_VALUES],
        F.col(SEED),
        *[F.col(c) for c in _ORDER],
        F.col(PREV_OBSERVED),
        F.row_number().over(ordered).alias("_i"),
        F.count(F.lit(1)).over(whole).alias("_n"),
        F.sum(F.lit(1) - F.col(SEED)).over(whole).alias("_m"),
    ]
    sig = _signature(F.col("state"), F.col("lag_state"))
    ok = _signature(F.lit(State.OK.value), F.lit(State.OK.value))
    before = F.coalesce(F.lag(sig).over(ordered), ok)
    observation = F.col(SEED) == 0
    lag_state = F.col("lag_state")
    flags = [
        (observation & (sig != before)).alias(CHANGE),
        (F.col("_i") == F.col("_n")).alias(LAST),
        F.col("_m").alias(IN_BATCH),
        (
            observation
            & (lag_state == _OUT_OF_SYNC)
            & (F.coalesce(F.lag(lag_state).over(ordered), F.lit(State.OK.value)) != _OUT_OF_SYNC)
        )
        .cast("long")
        .alias(_ENTERED),
        # The largest ratio of the batch's observations so far (the seed's own when it has none).
        F.coalesce(F.max(F.when(observation, F.col("lag_ratio"))).over(upto), F.col("lag_ratio")).alias(_PEAK),
    ]
    # The episodes so far: a window over the flags, so a pass of its own. Every entry into
    # out-of-sync is also a change, so it counts the same over the changes alone.
    episodes = [
        (F.coalesce(F.col("out_of_sync_episodes"), F.lit(0)).cast("long") + F.sum(F.col(_ENTERED)).over(upto)).alias(
            "out_of_sync_episodes"
        ),
    ]
    return seeds, running, flags, episodes


def observed_keys(rows: DataFrame) -> DataFrame:
    """The replicas ``rows`` (``observation_rows``) observe, once each: what ``split_carried`` splits by."""
    return rows.select(*KEY_COLUMNS).distinct()


def split_carried(carried: DataFrame, keys: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(the carried rows of the replicas in ``keys``, ``observed_keys`` of the batch; the
    others'). Only the first go through ``evaluate_batch``'s window: a replica without
    observations in the batch keeps its row as it is, so the others go to the state's new
    version unchanged (``next_state``). A fleet polled every 5 s at a 1 s trigger observes
    one replica in five a batch; the window's shuffle and sort would carry the other four.
    The keys are broadcast (one per replica observed: bounded by the batch's observations),
    so the carried rows are not shuffled to be matched."""
    keys = F.broadcast(keys)
    return carried.join(keys, KEY_COLUMNS, "left_semi"), carried.join(keys, KEY_COLUMNS, "left_anti")


def next_state(evaluated: DataFrame, idle: DataFrame | None = None) -> DataFrame:
    """The state's new version: the newest row of each replica ``evaluated``
    (``evaluate_batch``'s output) and the ``idle`` replicas' carried rows as they were
    (``split_carried``; None: every carried row was evaluated)."""
    state = projection.select(evaluated.where(F.col(LAST)), *STATE_COLUMNS)
    return state if idle is None else state.unionByName(idle)


def evaluate_batch(
    rows: DataFrame,
    carried: DataFrame,
    cfg: RuleConfig,
    th: Thresholds,
    max_gap_ms: int | None,
    driver_rows_only: bool = False,
) -> DataFrame:
    """The state as of every row of ``rows`` (``observation_rows``), each evaluated.

    ``carried``: the state before the batch (``STATE_COLUMNS``; its rows are the
    seeds). Output: every seed and observation row with the running state
    (``STATE_COLUMNS``), the status columns (``evaluate.STATUS_COLUMNS`` +
    ``EXTRA_COLUMNS``), ``_seed``, ``_change`` (an observation whose state or
    lag state differs from the row before: a transition, at its ``eval_ms``),
    ``_last`` (the replica's newest row: its new state) and ``_in_batch`` (the
    replica's observations in the batch). A replica without observations in
    the batch has its seed alone, unchanged.

    ``max_gap_ms``: as for ``observation_rows``; here also for what an observation
    shows against the replica's previous one (``_history_exprs``).

    ``driver_rows_only``: only the rows with ``_change`` or ``_last`` (what the job
    takes: the driver's rows and the state), filtered before the episode count and
    the full status, so both run on those rows alone.

    Every row is evaluated only as far as its flags need (``state``,
    ``lag_state``, ``lag_ratio``); the full status is the last projection, so a
    filter on the flags (``for_the_driver``, the state's ``_last`` rows) runs
    before it and Spark evaluates the full status of those rows alone.
    """
    seeds, running, flags, episodes = _batch_exprs()
    select = projection.select  # each list handed to the JVM once (its Columns are built once)
    both = select(carried, *seeds).unionByName(select(rows, *STATE_COLUMNS, SEED, NO_PREV))
    both = select(both, "*", *_order_columns())
    both = select(both, *_history_exprs(cfg, max_gap_ms))
    judged = evaluate.status_columns(select(both, *running), cfg, th, keep=_JUDGED_KEEP, only=_PER_ROW)
    flagged = select(judged, *_VALUES, "lag_ratio", *flags)
    if driver_rows_only:
        flagged = flagged.where(_change_or_last())
    counted = select(flagged, *_COUNTED, *episodes)
    full = evaluate.status_columns(counted, cfg, th, keep=_FULL_KEEP)
    return select(full, *_with_batch_peak())


def for_the_driver(
    evaluated: DataFrame,
    watched_keys: Collection[str],
    refresh_batches: int,
    lookahead: Reach | None = None,
    clocks: bool = True,
) -> DataFrame:
    """The rows of ``evaluate_batch``'s output the driver takes: every change
    (its alerts, with their times) and the newest row of every replica observed
    in the batch (its gauges), those of ok replicas only when due for a refresh
    when ``refresh_batches`` > 1, or watched, or within ``lookahead``'s reach
    (``evaluate.for_the_driver``, and its ``clocks``). The same rows are the state
    topic's records with ``--driver-replicas not-ok`` (without ``clocks``)."""
    columns = [*evaluate.STATUS_COLUMNS, *evaluate.EXTRA_COLUMNS, CHANGE, LAST]
    if refresh_batches <= 1:
        return projection.select(evaluated.where(_driver_rows()), *columns)
    # A replica's newest row that is itself a change always goes (it may be a return to ok).
    changes = evaluated.where(F.col(CHANGE))
    finals = evaluated.where(F.col(LAST) & (F.col(IN_BATCH) > 0) & ~F.col(CHANGE))
    finals = evaluate.for_the_driver(finals, watched_keys, refresh_batches, lookahead, clocks)
    return changes.select(*columns).unionByName(finals.select(*columns))


def held_for_the_driver(
    evaluated: DataFrame,
    watched_keys: Collection[str],
    default_min_isr: int,
    lookahead: Reach | None,
    totals: Observation,
    clusters: Collection[str],
) -> DataFrame:
    """``for_the_driver`` with ``--driver-replicas not-ok``: every change, and of the newest
    rows only those ``evaluate.held`` keeps. What the driver would have counted from
    the rest comes in ``totals`` (``totals_exprs``: Spark's observed metrics, gathered as the
    rows pass, without a stage of their own) once the rows are taken."""
    columns = [*evaluate.STATUS_COLUMNS, *evaluate.EXTRA_COLUMNS, CHANGE, LAST]
    rows = evaluated.where(_driver_rows()).observe(totals, *totals_exprs(tuple(sorted(clusters))))
    rows = evaluate.with_key_flag(rows, watched_keys, _HELD)
    kept = rows.where(F.col(CHANGE) | evaluate.held(default_min_isr, lookahead, F.col(_HELD)))
    return projection.select(kept, *columns)


def totals_exprs(clusters: tuple[str, ...]) -> list[Column]:
    """What a batch observed (over ``evaluate_batch``'s rows with ``_change`` or ``_last``):
    ``observations``, ``replicas`` observed, ``clusters`` (their names) and, for each of the
    ``clusters`` given (those the driver knows), ``t_<i>``: its newest telemetry time (its
    clock). A cluster new to the driver has no clock here: ``newest_times`` gives it."""
    newest = F.col(LAST) & (F.col(IN_BATCH) > 0)
    out = [
        F.coalesce(F.sum(F.when(newest, F.col(IN_BATCH))), F.lit(0)).cast("long").alias("observations"),
        F.count(F.when(newest, F.lit(1))).cast("long").alias("replicas"),
        F.collect_set("cluster").alias("clusters"),
    ]
    out += [F.max(F.when(F.col("cluster") == c, F.col("last_t_ms"))).alias(f"t_{i}") for i, c in enumerate(clusters)]
    return out


def count_totals(evaluated: DataFrame, clusters: tuple[str, ...]) -> dict[str, object]:
    """``totals_exprs`` over ``evaluated``'s driver rows by a Spark job of its own: what
    ``held_for_the_driver``'s observation gathers, for a batch whose observation Spark does
    not answer (``streaming.evaluation.batch.observed_metrics``)."""
    return evaluated.where(_driver_rows()).agg(*totals_exprs(clusters)).collect()[0].asDict()


def newest_times(evaluated: DataFrame, clusters: Collection[str]) -> dict[str, int]:
    """Each of ``clusters``' newest telemetry time in ``evaluated`` (a Spark job of its own:
    only for a cluster new to the driver, ``totals_exprs``)."""
    rows = (
        evaluated.where(F.col(LAST) & (F.col(IN_BATCH) > 0) & F.col("cluster").isin(sorted(clusters)))
        .groupBy("cluster")
        .agg(F.max("last_t_ms").alias("t"))
        .collect()
    )
    return {r["cluster"]: int(r["t"]) for r in rows}


@functools.cache
def _change_or_last() -> Column:
    return F.col(CHANGE) | F.col(LAST)


@functools.cache
def _driver_rows() -> Column:
    return (F.col(LAST) & (F.col(IN_BATCH) > 0)) | F.col(CHANGE)
