"""The replica state is stated in three places that must agree: the core's
``ReplicaAggregate`` (what evaluation reads), the job's state columns
(``streaming.evaluation.replicas.STATE_COLUMNS``, how each is carried across batches) and the
``latest`` struct (``streaming.evaluation.state.LATEST_COLUMNS``). A field added to one and
not the others fails here, naming it."""

from __future__ import annotations

import dataclasses

from isrwatch.status import ReplicaAggregate
from streaming.evaluation import replicas
from streaming.evaluation.state import KEY_COLUMNS, LATEST_COLUMNS

# State columns that are not ReplicaAggregate fields: the times that pick the newest
# values, the counters, and the struct holding the newest observation's fields.
BOOKKEEPING = {"latest", "latest_t", "known_leo_t", "known_leader_leo_t", "observations", "out_of_sync_episodes"}


def test_every_aggregate_field_is_carried_in_the_state() -> None:
    fields = {f.name for f in dataclasses.fields(ReplicaAggregate)}
    carried = set(replicas.STATE_COLUMNS) | set(LATEST_COLUMNS)
    assert fields <= carried, f"not in the state: {sorted(fields - carried)}"


def test_every_state_column_is_an_aggregate_field_or_its_bookkeeping() -> None:
    fields = {f.name for f in dataclasses.fields(ReplicaAggregate)}
    extra = set(replicas.STATE_COLUMNS) - fields - BOOKKEEPING
    assert not extra, f"state columns the evaluation never reads: {sorted(extra)}"
    assert set(LATEST_COLUMNS) <= fields


def test_every_state_column_says_how_two_rows_combine() -> None:
    combined = set(replicas._COMBINE) | set(replicas._BY)
    missing = set(replicas.STATE_COLUMNS) - set(KEY_COLUMNS) - combined
    assert not missing, f"no running aggregate for: {sorted(missing)}"
