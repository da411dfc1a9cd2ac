"""Replica statuses for the exporter tests."""

from __future__ import annotations

from hypothesis import strategies as st

from exporter.store import StatusStore
from isrwatch.alerts import Transition, replica_alerts
from isrwatch.status import ReplicaStatus, State

__all__ = ["replica", "replica_statuses", "shorter_lag_evidence"]


def replica(
    broker_id: int,
    state: State = State.OK,
    *,
    cluster: str = "prod",
    topic: str = "orders",
    partition: int = 0,
    leader_id: int = 1,
    eval_ms: int = 1_700_000_000_000,
    ratio: float = 0.0,
    offset_lag: int = 0,
    in_isr: bool = True,
    isr_size: int = 3,
    min_isr: int | None = 2,
    peak: float | None = None,
    episodes: int = 0,
    lag_time_max_ms: int = 30_000,
) -> ReplicaStatus:
    """A follower's status consistent with ``ratio``: caught up ``ratio`` x lag before
    ``eval_ms``, its removal window from then + lag for half a lag (a leader's check)."""
    lag_s = lag_time_max_ms / 1000
    start = eval_ms + round((1 - ratio) * lag_time_max_ms)
    return ReplicaStatus(
        cluster=cluster,
        topic=topic,
        partition=partition,
        broker_id=broker_id,
        leader_id=leader_id,
        eval_ms=eval_ms,
        state=state,
        time_since_caught_up_s=ratio * lag_s,
        lag_ratio=ratio,
        time_to_shrink_s=max(0.0, lag_s - ratio * lag_s),
        offset_lag=offset_lag,
        in_isr=in_isr,
        isr_size=isr_size,
        min_isr=min_isr,
        lag_time_max_ms=lag_time_max_ms,
        shrink_window_start_ms=start,
        shrink_window_end_ms=start + lag_time_max_ms // 2,
        peak_lag_ratio=None if peak is None else max(peak, ratio),
        out_of_sync_episodes=episodes,
    )


def replica_statuses() -> st.SearchStrategy[ReplicaStatus]:
    """Any status ``replica`` makes: every state, odd names, ratios past 1, episodes."""
    return st.builds(
        replica,
        broker_id=st.integers(1, 4),
        state=st.sampled_from(list(State)),
        cluster=st.sampled_from(["prod", 'we"ird\\name\nx', "dr-site"]),
        topic=st.sampled_from(["orders", "payments.v2", "_internal"]),
        partition=st.integers(0, 3),
        leader_id=st.integers(1, 4),
        eval_ms=st.integers(1_600_000_000_000, 1_600_000_100_000),
        ratio=st.floats(0, 3, allow_nan=False),
        offset_lag=st.integers(0, 10**12),
        in_isr=st.booleans(),
        isr_size=st.integers(1, 4),
        min_isr=st.one_of(st.none(), st.integers(1, 3)),
        peak=st.one_of(st.none(), st.floats(0, 3, allow_nan=False)),
        episodes=st.integers(0, 3),
    )


def shorter_lag_evidence(store: StatusStore) -> None:
    """The job's shrink accounting finds leader 1 dropping follower prod/orders/0/2 20 s after
    its last catch-up, the job's lag 30 s: evidence the brokers' is shorter (isrwatch.outcomes)."""
    o = store.outcomes
    o.leader_count("prod", 1, 0, 0)
    s = replica(2, State.NEARING, eval_ms=15_000, ratio=0.5)  # caught up at 0
    o.behind(s)
    o.alerts(Transition(replica_alerts(s), [], []), 15_000)
    o.leader_count("prod", 1, 19_000, 1)
    o.isr_change("prod", "orders", 0, 20_000, left=[2], leader=1)
    o.settle({"prod": 30_000})
