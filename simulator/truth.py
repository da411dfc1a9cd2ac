"""The truth: every ISR change the simulated brokers really made, with its time.

Tests and demos compare what isrwatch predicted with these. ``cause`` says who
made the change: ``leader-check`` (the leader's periodic ISR check shrank it),
``follower-fetch`` (a follower reached the high watermark and rejoined) or
``controller`` (a broker's session expired: removed from every ISR, and
leadership moved to the first other ISR member).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import IO, Any

__all__ = ["TrueChange", "write_truth", "read_truth"]


@dataclass(frozen=True)
class TrueChange:
    t_ms: int
    topic: str
    partition: int
    change: str  # "shrink" | "expand"
    cause: str  # "leader-check" | "follower-fetch" | "controller"
    brokers: tuple[int, ...]  # the followers removed or added
    isr_before: tuple[int, ...]
    isr_after: tuple[int, ...]
    leader_before: int | None
    leader_after: int | None
    hw: int
    # leader-check shrink: each removed follower's lastCaughtUpTimeMs; expand: the follower's LEO.
    last_caught_up_ms: tuple[int, ...] = ()
    leo: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> TrueChange:
        d: dict[str, Any] = json.loads(line)
        for k in ("brokers", "isr_before", "isr_after", "last_caught_up_ms"):
            d[k] = tuple(d[k])
        return cls(**d)


def write_truth(fh: IO[str], changes: list[TrueChange]) -> None:
    """Append changes as JSON lines and flush (the file can be tailed)."""
    for c in changes:
        fh.write(c.to_json() + "\n")
    fh.flush()


def read_truth(fh: IO[str]) -> list[TrueChange]:
    return [TrueChange.from_json(line) for line in fh if line.strip()]
