"""What one setting would have done, counted from its replicas' ISR transitions. Pure Python.

A *shrink* is a follower entering out-of-sync under the setting's rule, an *expand* its
return; a *flap* is a shrink whose expand follows within the flap window (the seeds'
"thrashing": a healthy follower thrown out by a burst and let back in). Time out of the ISR
is counted to the expand, or to the end of the recording for a follower still out.
A partition is under ``min.insync.replicas`` while its replicas less its followers out of
sync number fewer than the ``min_isr`` its telemetry reported (partitions whose telemetry
gave none are not counted).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Transition", "Tally", "tally"]

Key = tuple[str, str, int, int]  # cluster, topic, partition, broker_id
Partition = tuple[str, str, int]


@dataclass(frozen=True)
class Transition:
    """A follower's out-of-sync verdict changed at ``t_ms`` (``out``: it left the ISR)."""

    key: Key
    t_ms: int
    out: bool
    replicas: int | None = None  # the partition's replica count, when reported
    min_isr: int | None = None
    warning: bool = False  # not out, but nearing the lag (the Nearing / Imminent alerts' states)


@dataclass
class Tally:
    shrinks: int = 0
    expands: int = 0
    flaps: int = 0
    replica_seconds_out: float = 0.0
    under_min_isr_partitions: int = 0
    under_min_isr_seconds: float = 0.0
    shrinks_by_partition: Counter[Partition] = field(default_factory=Counter)
    shrinks_by_broker: Counter[tuple[str, int]] = field(default_factory=Counter)
    shrink_events: list[tuple[Key, int]] = field(default_factory=list)  # every shrink: (replica, t_ms)
    # per shrink: seconds from the follower's first warning (nearing the lag) to the shrink; 0: none
    warning_leads_s: list[float] = field(default_factory=list)
    # (t_ms, followers out of the ISR from then on), in time order: the fleet's ISR over time
    out_over_time: list[tuple[int, int]] = field(default_factory=list)

    def as_dict(self, top: int) -> dict[str, Any]:
        return {
            "shrinks": self.shrinks,
            "expands": self.expands,
            "flaps": self.flaps,
            "replica_seconds_out_of_isr": round(self.replica_seconds_out, 3),
            "partitions_under_min_isr": self.under_min_isr_partitions,
            "seconds_under_min_isr": round(self.under_min_isr_seconds, 3),
            "worst_partitions": [
                {"cluster": c, "topic": t, "partition": p, "shrinks": n}
                for (c, t, p), n in self.shrinks_by_partition.most_common(top)
            ],
            "worst_brokers": [
                {"cluster": c, "broker_id": b, "shrinks": n} for (c, b), n in self.shrinks_by_broker.most_common(top)
            ],
            "shrinks_warned": sum(1 for lead in self.warning_leads_s if lead > 0),
            "warning_lead_s_median": _median(self.warning_leads_s),
            # when each follower would have been dropped, every time: what a setting changes in detection
            "shrink_events": [
                {"cluster": c, "topic": t, "partition": p, "broker_id": b, "t_ms": ms}
                for (c, t, p, b), ms in sorted(self.shrink_events, key=lambda e: (e[1], e[0]))
            ],
        }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return round(ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2, 3)


def tally(transitions: Iterable[Transition], end_ms: int, flap_window_ms: int) -> Tally:
    """Count ``transitions`` (any order) of a recording that ends at ``end_ms``."""
    out = Tally()
    by_replica: dict[Key, list[Transition]] = defaultdict(list)
    for tr in transitions:
        by_replica[tr.key].append(tr)
    # partition -> [(t, +1 out / -1 back)], and what it reported of its size
    moves: dict[Partition, list[tuple[int, int]]] = defaultdict(list)
    sizes: dict[Partition, tuple[int | None, int | None]] = {}
    for key, trs in by_replica.items():
        trs.sort(key=lambda tr: tr.t_ms)
        part: Partition = key[:3]
        left: int | None = None
        warned: int | None = None  # since when the follower has been nearing the lag
        for tr in trs:
            if tr.replicas is not None or tr.min_isr is not None:
                sizes[part] = (tr.replicas, tr.min_isr)
            if tr.warning and warned is None and left is None:
                warned = tr.t_ms
            elif not tr.warning and not tr.out:
                warned = None
            if tr.out and left is None:
                left = tr.t_ms
                out.warning_leads_s.append((tr.t_ms - warned) / 1000.0 if warned is not None else 0.0)
                warned = None
                out.shrinks += 1
                out.shrinks_by_partition[part] += 1
                out.shrinks_by_broker[(key[0], key[3])] += 1
                out.shrink_events.append((key, tr.t_ms))
                moves[part].append((tr.t_ms, 1))
            elif not tr.out and left is not None:
                out.expands += 1
                if tr.t_ms - left <= flap_window_ms:
                    out.flaps += 1
                out.replica_seconds_out += (tr.t_ms - left) / 1000.0
                moves[part].append((tr.t_ms, -1))
                left = None
        if left is not None:
            out.replica_seconds_out += max(0, end_ms - left) / 1000.0
    away_total = 0
    for t, step in sorted(e for events in moves.values() for e in events):
        away_total += step
        out.out_over_time.append((t, away_total))
    for part, events in moves.items():
        replicas, min_isr = sizes.get(part, (None, None))
        if replicas is None or min_isr is None:
            continue
        events.sort()
        away, under_since, went_under = 0, None, False
        for t, step in events:
            away += step
            under = replicas - away < min_isr
            if under and under_since is None:
                under_since, went_under = t, True
            elif not under and under_since is not None:
                out.under_min_isr_seconds += (t - under_since) / 1000.0
                under_since = None
        if under_since is not None:
            out.under_min_isr_seconds += max(0, end_ms - under_since) / 1000.0
        out.under_min_isr_partitions += went_under
    return out
