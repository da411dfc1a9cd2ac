"""The fast text writer gives exactly the samples of the custom collector."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition import render
from exporter.families import MetricsView, StoreCollector
from exporter.store import StatusStore
from tests.exporter.samples import replica_statuses, shorter_lag_evidence

Sample = tuple[str, tuple[tuple[str, str], ...], float]


def parsed(text: str) -> tuple[set[str], list[Sample]]:
    families = list(text_string_to_metric_families(text))
    samples = sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in families for s in f.samples)
    return {f"{f.name} {f.type} {f.documentation}" for f in families}, samples


def both(store: StatusStore, view: MetricsView) -> tuple[tuple[set[str], list[Sample]], tuple[set[str], list[Sample]]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(
        StoreCollector(
            store,
            default_min_isr=view.default_min_isr,
            replica_series=view.replica_series,
            replica_series_top=view.replica_series_top,
            partition_series=view.partition_series,
        )
    )
    return parsed(render(store.snapshot(), view)), parsed(generate_latest(reg).decode())


replicas = replica_statuses()


@settings(max_examples=60, deadline=None)
@given(
    statuses=st.lists(replicas, max_size=25),
    changes=st.lists(st.tuples(st.sampled_from(["shrink", "expand"]), st.integers(1, 5)), max_size=3),
    batches=st.lists(st.tuples(st.floats(0, 10), st.integers(0, 1000)), max_size=2),
    unreadable=st.none() | st.integers(0, 10),  # None: not the exporter's store
    view=st.builds(
        MetricsView,
        default_min_isr=st.integers(1, 3),
        replica_series=st.sampled_from(["all", "not-ok"]),
        replica_series_top=st.integers(0, 5),
        partition_series=st.sampled_from(["all", "at-risk"]),
    ),
)
def test_render_matches_the_collector(statuses, changes, batches, unreadable, view) -> None:
    store = StatusStore(derive_isr_changes=True)
    store.update(statuses)
    for change, n in changes:
        store.add_isr_changes('we"ird\\name\nx', "orders", 1, change, n)
    for duration, observations in batches:
        store.health.record_batch(duration, observations, {"bad_json": 1, "unknown version": observations % 3})
    if len(statuses) % 2:
        store.health.set_up(False)
    if unreadable is not None:
        store.health.count_unreadable(unreadable)
    fast, reference = both(store, view)
    assert fast == reference


def test_render_matches_the_collector_on_the_shrink_outcomes() -> None:
    store = StatusStore()
    shorter_lag_evidence(store)
    store.health.record_batch(1.0, 10, {})
    fast, reference = both(store, MetricsView())
    assert fast == reference
    assert ("isrwatch_lag_time_evidence_total", (("cluster", "prod"), ("direction", "shorter")), 1.0) in fast[1]
