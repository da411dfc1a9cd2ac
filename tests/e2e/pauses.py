"""One broker paused under load until the leaders drop it from the ISR, then resumed:
what the job printed, and when, against what the brokers logged (issues 9 and 17; the
job on a Spark cluster, issue 12)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.gauges import GaugeWatch, exporter_agrees
from tests.e2e.pipeline import Pipeline, until
from tests.e2e.results import Shrinks, first_event, nearing_row

__all__ = ["layout", "pause_round", "AGREE_S"]

# How long the exporter may take to agree with the job once a round's alerts have resolved.
AGREE_S = 10.0


def layout(cluster: Any, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """partition -> (leader, replicas) of ``topic`` as metadata shows it."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient(cluster.client_config()).list_topics(topic, timeout=30).topics[topic]
    return {p.id: (p.leader, tuple(p.replicas)) for p in md.partitions.values()}


def pause_round(
    cluster: Any,
    pipe: Pipeline,
    topic: str,
    broker: int,
    layout: dict[int, tuple[int, tuple[int, ...]]],
    watch: GaugeWatch | None,
    every_replica: bool = True,
) -> dict[str, Any]:
    followed = sorted(p for p, (leader, replicas) in layout.items() if broker in replicas and leader != broker)
    led = sorted(p for p, (leader, _) in layout.items() if leader == broker)
    events_before = len(pipe.alerts())
    paused_at = time.time()
    cluster.pause(broker)
    batch_times: list[float] = []
    try:
        seen = len(pipe.batches())

        def all_shrunk() -> bool:
            nonlocal seen
            now = len(pipe.batches())
            if now > seen:
                batch_times.append(time.time())
                seen = now
            shrinks = Shrinks.read(cluster, topic, paused_at)
            return all(shrinks.first(p, broker) is not None for p in followed)

        until(f"the leaders to drop broker {broker} from the ISR", all_shrunk, 4 * cluster.lag_time_max_ms / 1000, pipe)
    finally:
        cluster.resume(broker)
    resumed_at = time.time()
    # Rejoins are looked for from the pause on, not from resumed_at: a leader logged the
    # follower back 40 ms after SIGCONT, before resume() had returned (measured; the round
    # then waited 120 s for a rejoin that had already happened). The follower cannot rejoin
    # while it is paused, so every expansion adding it after paused_at is the rejoin.
    during = pipe.alerts()[events_before:]
    shrinks = Shrinks.read(cluster, topic, paused_at)

    def back() -> bool:
        return all(
            any(c.topic == topic and c.partition == p and broker in c.isr_after for c in cluster.isr_expands(paused_at))
            for p in followed
        )

    # Kafka 0.9 after a hang: a leader may keep a stale ZooKeeper version of the ISR and
    # refuse every expansion from then on ("Cached zkVersion ... not equal to that in
    # zookeeper, skip updating ISR", KAFKA-2729): the broker's bug, not the monitor's. Seen
    # after the controller's pause (so it is paused last); it may follow any hang. A round
    # whose brokers logged that is recorded as stuck; otherwise the rejoin must come within
    # 120 s (the failure carries the brokers' ISR lines).
    deadline = time.monotonic() + 120
    while not back() and time.monotonic() < deadline:
        pipe.check_alive(f"broker {broker} back in the ISR")
        time.sleep(0.5)
    stuck_isr = not back() and _kafka_2729(cluster)
    if not back() and not stuck_isr:
        pytest.fail(f"broker {broker} not back in the ISR of {topic} within 120 s:\n{_isr_log(cluster, topic)}")
    rejoined: dict[int, float] = {}
    if not stuck_isr:
        for c in cluster.isr_expands(paused_at):
            if c.topic == topic and broker in c.isr_after and c.partition in followed:
                rejoined.setdefault(c.partition, c.time)

        def resolved() -> bool:
            # this round's events only: an alert of the same identity resolved in an earlier
            # round says nothing about this one
            mine = [e for e in pipe.alerts()[events_before:] if e.replica[0] == topic]
            firing = {e.identity for e in mine if e.status == "firing"}
            return firing <= {e.identity for e in mine if e.status == "resolved"}

        until(f"the alerts of broker {broker}'s pause to resolve", resolved, 180, pipe)
        if watch is not None:
            # everything the job said during the fault has reached the exporter through the state topic
            until(
                "the exporter's states to agree with the job's",
                lambda: exporter_agrees(watch, every_replica),
                AGREE_S,
                pipe,
            )

    # this round's alerts only: a follower may have been alerted in an earlier round, when
    # its partition's leader was the broker paused (a paused leader, resumed, shrinks the
    # ISR to itself: a real shrink of this follower, alerted then)
    nearing = first_event(pipe, AlertName.NEARING, "firing", topic, broker, since=paused_at)
    stalled = first_event(pipe, AlertName.STALLED, "firing", topic, broker, since=paused_at)
    edges = [paused_at, *batch_times, resumed_at]
    rows = []
    for p in followed:
        row = nearing_row(
            f"broker {broker} paused",
            topic,
            p,
            broker,
            paused_at,
            nearing.get(p),
            shrinks.first(p, broker),
            cluster.lag_time_max_ms,
        )
        row["stalled_arrived"] = stalled[p].arrived if p in stalled else None
        if watch is not None:
            shrink = row["shrink_at"]
            for kind in ("job", "exporter", "prometheus"):
                at = watch.first(kind, p, broker, paused_at)
                row[f"{kind}_nearing_at"] = at
                row[f"{kind}_lead_s"] = (shrink - at) if at and shrink else None
        rows.append(row)
    return {
        "broker": broker,
        "controller": broker == cluster.controller_id(),
        "isr_stuck_kafka_2729": stuck_isr,
        "followed": followed,
        "led": led,
        "paused_at": paused_at,
        "resumed_at": resumed_at,
        "paused_s": resumed_at - paused_at,
        "batches_during_pause": len(batch_times),
        "longest_batch_gap_s": max(b - a for a, b in zip(edges, edges[1:], strict=False)),
        # lag alerts of the paused follower that resolved before the leader took it back
        "resolved_before_rejoin": [
            [e.name, e.replica[1], e.arrived, rejoined[e.replica[1]]]
            for e in pipe.alerts()[events_before:]
            if e.status == "resolved"
            and e.replica[0] == topic
            and e.replica[2] == broker
            and e.replica[1] in rejoined
            and e.name != AlertName.STALLED.value  # the broker answers again before it rejoins
            and e.arrived < rejoined[e.replica[1]]
        ],
        "misplaced_during_pause": [
            [e.name, *e.replica]
            for e in during
            if e.replica[0] == topic and e.replica[1] in led and e.replica[2] != broker
        ],
        "rows": rows,
    }


def _isr_log(cluster: Any, topic: str) -> str:
    """The brokers' log lines on ``topic``'s ISR and fetchers, the last 40, for a failure message."""
    lines = []
    for b in cluster.broker_ids:
        for line in cluster.broker_log(b).read_text(errors="replace").splitlines():
            if topic in line and any(w in line for w in ("ISR", "zkVersion", "rror", "etcher", "eader")):
                lines.append(f"broker {b}: {line}")
    return "\n".join(lines[-40:])


def _kafka_2729(cluster: Any) -> bool:
    return any("Cached zkVersion" in cluster.broker_log(b).read_text(errors="replace") for b in cluster.broker_ids)
