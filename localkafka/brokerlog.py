"""The ISR changes a Kafka broker writes to its log: the ground truth of tests.

A 0.9 leader logs, through log4j with the pattern ``[%d{ISO8601}] %p %m (%c)``
and the JVM in UTC::

    [2025-11-21 11:20:03,412] INFO Partition [orders,0] on broker 1: Shrinking ISR for partition [orders,0] from 1,2,3 to 1,3 (kafka.cluster.Partition)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

__all__ = ["IsrChangeLine", "elected_controller", "parse_isr_change", "read_isr_changes"]

_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*?"
    r"(?P<kind>Shrinking|Expanding) ISR for partition \[(?P<topic>[^,\]]+),(?P<partition>\d+)\] "
    r"from (?P<before>[\d,]*) to (?P<after>[\d,]*)"
)


class IsrChangeLine(NamedTuple):
    """One ``Shrinking``/``Expanding ISR`` line: when (epoch seconds), what, and which leader logged it."""

    time: float
    topic: str
    partition: int
    isr_before: tuple[int, ...]
    isr_after: tuple[int, ...]
    broker_id: int | None = None
    kind: str = "shrink"


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def parse_isr_change(line: str, broker_id: int | None = None) -> IsrChangeLine | None:
    """The ISR change in one log line, or None when the line is something else."""
    m = _LINE.match(line)
    if not m:
        return None
    ts = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()
    return IsrChangeLine(
        time=ts,
        topic=m["topic"],
        partition=int(m["partition"]),
        isr_before=_ids(m["before"]),
        isr_after=_ids(m["after"]),
        broker_id=broker_id,
        kind="shrink" if m["kind"] == "Shrinking" else "expand",
    )


def read_isr_changes(path: Path, broker_id: int | None = None, since: float = 0.0) -> list[IsrChangeLine]:
    """Every ISR change in one broker log at or after ``since`` (epoch seconds); [] when there is no log."""
    if not path.exists():
        return []
    out = []
    with path.open(errors="replace") as fh:
        for line in fh:
            if "ISR for partition" not in line:
                continue
            change = parse_isr_change(line, broker_id)
            if change is not None and change.time >= since:
                out.append(change)
    return out


def elected_controller(logs: Mapping[int, Path]) -> int | None:
    """Of the brokers whose ``server.log`` is given, the one that most recently logged
    winning the controller election ("<id> successfully elected as leader"), or None."""
    latest: tuple[str, int] | None = None
    for broker_id, path in logs.items():
        if not path.exists():
            continue
        with path.open(errors="replace") as f:
            for line in f:
                if f"] INFO {broker_id} successfully elected as leader" in line:
                    stamp = line[1:24]
                    if latest is None or stamp >= latest[0]:
                        latest = (stamp, broker_id)
    return latest[1] if latest else None
