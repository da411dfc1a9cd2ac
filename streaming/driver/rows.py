"""The driver's rows of a micro-batch, as Python: Spark's statuses (``streaming.evaluation``'s
one Arrow table) to ``ReplicaStatus`` objects, the changes apart from each replica's newest.

Column by column, once per batch: the only place a replica's row becomes a Python object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar  # Any: columns read from untyped pyarrow (statuses_from_arrow)

from isrwatch.status import ReplicaStatus, State, status_from_values
from streaming.evaluation.evaluate import EXTRA_COLUMNS, STATUS_COLUMNS
from streaming.evaluation.replicas import CHANGE, LAST

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Evaluated", "statuses_from_arrow", "split_driver_rows"]

# One evaluated replica: its status, its newest telemetry time, its observations ever, and the
# time of its observation before the newest (None: not known, as for a replica's first, or
# for a status restored from the state table, which keeps only the newest).
Evaluated = tuple[ReplicaStatus, int, int, int | None]

_STATES = {s.value: s for s in State}

# The columns whose values a batch repeats across its rows (its clusters and topics, the
# telemetry time of a round, the lag time): held once per value, not once per replica.
_SHARED_AT = tuple(
    (STATUS_COLUMNS + EXTRA_COLUMNS).index(name)
    for name in ("cluster", "topic", "eval_ms", "lag_time_max_ms", "last_t_ms")
)


_V = TypeVar("_V")


def _shared(values: list[_V]) -> list[_V]:
    """``values`` with one object per distinct value: ``to_pylist`` makes a new str or
    large int per row, which the driver would then hold once per replica (~0.1 KB)."""
    one: dict[_V, _V] = {}
    return [one.setdefault(v, v) for v in values]


def statuses_from_arrow(table: pa.Table) -> Iterator[Evaluated]:
    """(status, last_t_ms, observations, prev_observed_ms) per row of
    ``streaming.evaluation.evaluate.status_columns``' output.

    Column by column to Python lists, then one constructor call per row: about
    a few µs a replica, against ~10 µs through ``Table.to_pylist()``'s dicts and
    the dataclass constructor.
    """
    names = STATUS_COLUMNS + EXTRA_COLUMNS
    cols: list[list[Any]] = [table.column(n).to_pylist() for n in names]  # Any: per-column types, pyarrow untyped
    for at in _SHARED_AT:
        cols[at] = _shared(cols[at])
    state_at, lag_state_at = STATUS_COLUMNS.index("state"), STATUS_COLUMNS.index("lag_state")
    cols[state_at] = [_STATES[v] for v in cols[state_at]]
    cols[lag_state_at] = [_STATES[v] for v in cols[lag_state_at]]
    n = len(STATUS_COLUMNS)
    for values in zip(*cols, strict=True):
        yield status_from_values(values[:n]), values[n], values[n + 1], values[n + 2]


def split_driver_rows(table: pa.Table) -> tuple[list[ReplicaStatus], Iterator[Evaluated]]:
    """(changes in time order, finals) of ``streaming.evaluation.replicas.for_the_driver``'s rows: the
    statuses at which a replica's state changed, and each observed replica's
    newest (status, last_t_ms, observations, prev_observed_ms)."""
    change = table.column(CHANGE).to_pylist()
    last = table.column(LAST).to_pylist()
    changes: list[ReplicaStatus] = []
    finals: list[Evaluated] = []
    for item, c, f in zip(statuses_from_arrow(table), change, last, strict=True):
        if c:
            changes.append(item[0])
        if f:
            finals.append(item)
    changes.sort(key=lambda s: s.eval_ms)
    return changes, iter(finals)
