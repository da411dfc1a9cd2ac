"""The store's families written straight to the Prometheus text format
(version 0.0.4), without building a prometheus_client sample per series.

prometheus_client formats some 35k series a second; a fleet of a million
replicas is tens of millions of series with every option on, and still a
million partition series with the per-replica families cut down. This writer
builds each replica's and partition's label text once and reuses it across
its families, and gives the same samples as ``StoreCollector`` (a test holds
the two together).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from exporter.families import (
    CHANGES_FAMILY,
    CLUSTER_CHANGES_FAMILY,
    EPISODES_FAMILY,
    LAG_EVIDENCE_FAMILY,
    LEAD_FAMILY,
    PARTITION_GAUGES,
    PARTITIONS_FAMILY,
    REPLICA_GAUGES,
    SHRINKS_FAMILY,
    STATE_FAMILY,
    STATES,
    TELEMETRY_FAMILY,
    UNFOLLOWED_FAMILY,
    UNREADABLE_FAMILY,
    UP_FAMILY,
    UPDATED_FAMILY,
    MetricsView,
    job_families,
    outcome_rows,
    updated_at,
)
from exporter.store import StoreSnapshot

__all__ = ["render", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _value(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class _Escaper:
    """Label value escaping, cached: the same cluster and topic names recur."""

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        out = self._cache.get(text)
        if out is None:
            out = text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            self._cache[text] = out
        return out


def _header(out: list[str], name: str, help_text: str, kind: str) -> None:
    help_text = help_text.replace("\\", r"\\").replace("\n", r"\n")
    out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")


def _labels(pairs: Iterable[tuple[str, str]], esc: _Escaper) -> str:
    return ",".join(f'{k}="{esc(v)}"' for k, v in pairs)


def render(snap: StoreSnapshot, view: MetricsView) -> str:
    esc = _Escaper()
    out: list[str] = []

    replicas = view.replicas(snap)
    bodies = [
        f'cluster="{esc(s.cluster)}",topic="{esc(s.topic)}",partition="{s.partition}",'
        f'broker_id="{s.broker_id}",leader_id="{s.leader_id}"'
        for s in replicas
    ]
    for name, help_text, value in REPLICA_GAUGES:
        _header(out, name, help_text, "gauge")
        out.extend(f"{name}{{{b}}} {_value(value(s))}\n" for s, b in zip(replicas, bodies, strict=True))
    name, help_text = STATE_FAMILY
    _header(out, name, help_text, "gauge")
    for s, b in zip(replicas, bodies, strict=True):
        current = s.state.value
        out.extend(f'{name}{{{b},state="{st}"}} {"1.0" if st == current else "0.0"}\n' for st in STATES)
    name, help_text = UPDATED_FAMILY
    _header(out, name, help_text, "gauge")
    for s, b in zip(replicas, bodies, strict=True):
        at = updated_at(snap, s)
        if at is not None:
            out.append(f"{name}{{{b}}} {_value(at)}\n")
    name, help_text = EPISODES_FAMILY
    _header(out, name + "_total", help_text, "counter")
    for s in view.episode_replicas(snap, replicas):
        body = f'cluster="{esc(s.cluster)}",topic="{esc(s.topic)}",partition="{s.partition}",broker_id="{s.broker_id}"'
        out.append(f"{name}_total{{{body}}} {_value(s.out_of_sync_episodes)}\n")

    selection = view.partitions(snap)
    parts = [
        (f'cluster="{esc(c)}",topic="{esc(t)}",partition="{p}",leader_id="{v.newest.leader_id}"', v, min_isr)
        for (c, t, p), v, min_isr in selection.kept
    ]
    for name, help_text, pvalue in PARTITION_GAUGES:
        _header(out, name, help_text, "gauge")
        out.extend(f"{name}{{{b}}} {_value(pvalue(v, m))}\n" for b, v, m in parts)

    name, help_text = CHANGES_FAMILY
    _header(out, name + "_total", help_text, "counter")
    for (c, t, p, change), n in selection.changes(snap):
        body = _labels((("cluster", c), ("topic", t), ("partition", str(p)), ("change", change)), esc)
        out.append(f"{name}_total{{{body}}} {_value(n)}\n")

    name, help_text = PARTITIONS_FAMILY
    _header(out, name, help_text, "gauge")
    for (cluster, state), n in selection.counts.items():
        out.append(f'{name}{{cluster="{esc(cluster)}",state="{state}"}} {_value(n)}\n')
    name, help_text = CLUSTER_CHANGES_FAMILY
    _header(out, name + "_total", help_text, "counter")
    for (cluster, change), n in sorted(snap.cluster_isr_changes.items()):
        out.append(f'{name}_total{{cluster="{esc(cluster)}",change="{change}"}} {_value(n)}\n')

    name, help_text = TELEMETRY_FAMILY
    _header(out, name, help_text, "gauge")
    for cluster, ms in sorted(snap.telemetry_ms.items()):
        out.append(f'{name}{{cluster="{esc(cluster)}"}} {_value(ms / 1000.0)}\n')
    name, help_text = UP_FAMILY
    _header(out, name, help_text, "gauge")
    out.append(f"{name} {_value(1.0 if snap.up else 0.0)}\n")
    if snap.unreadable is not None:  # the exporter's store
        name, help_text = UNREADABLE_FAMILY
        _header(out, name + "_total", help_text, "counter")
        out.append(f"{name}_total {_value(snap.unreadable)}\n")

    if snap.batches:
        for kind, fname, help_text, labelnames, rows in job_families(snap):
            full = fname + ("_total" if kind == "counter" else "")
            _header(out, full, help_text, kind)
            for values, v in rows:
                body = _labels(zip(labelnames, values, strict=True), esc)
                out.append(f"{full}{{{body}}} {_value(v)}\n" if body else f"{full} {_value(v)}\n")
        _outcomes(out, snap, esc)
    return "".join(out)


def _outcomes(out: list[str], snap: StoreSnapshot, esc: _Escaper) -> None:
    """The shrink outcome families (``exporter.families.outcome_rows``)."""
    rows = outcome_rows(snap)
    name, help_text = SHRINKS_FAMILY
    _header(out, name + "_total", help_text, "counter")
    for cluster, by_outcome, _, _, _, _ in rows:
        out.extend(f'{name}_total{{cluster="{esc(cluster)}",outcome="{o}"}} {_value(n)}\n' for o, n in by_outcome)
    name, help_text = LEAD_FAMILY
    _header(out, name, help_text, "histogram")
    for cluster, _, buckets, lead_sum, _, _ in rows:
        c = esc(cluster)
        out.extend(f'{name}_bucket{{cluster="{c}",le="{le}"}} {_value(n)}\n' for le, n in buckets)
        out.append(f'{name}_count{{cluster="{c}"}} {_value(buckets[-1][1])}\n')
        out.append(f'{name}_sum{{cluster="{c}"}} {_value(lead_sum)}\n')
    name, help_text = UNFOLLOWED_FAMILY
    _header(out, name + "_total", help_text, "counter")
    for cluster, _, _, _, n, _ in rows:
        out.append(f'{name}_total{{cluster="{esc(cluster)}"}} {_value(n)}\n')
    name, help_text = LAG_EVIDENCE_FAMILY
    _header(out, name + "_total", help_text, "counter")
    for cluster, _, _, _, _, by_direction in rows:
        out.extend(f'{name}_total{{cluster="{esc(cluster)}",direction="{d}"}} {_value(n)}\n' for d, n in by_direction)
