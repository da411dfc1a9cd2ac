"""How the process that feeds a status store is doing, served beside its data.

``isrwatch_up`` (the job runs; the exporter reaches the state topic), and for the
streaming job: micro-batches and observations done, the last batch's duration,
dead letters by reason, and its output topics' pending and lost records (read
from the producer at every scrape); for the exporter, the state records it could
not read. Kept apart from the replicas' statuses
(``exporter.store``): one says what the cluster does, this what isrwatch does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Health", "HealthSnapshot"]


@dataclass(frozen=True)
class HealthSnapshot:
    up: bool
    batches: int
    observations: int
    last_batch_s: float | None
    deadletters: dict[str, int]  # reason -> count
    outputs: dict[str, tuple[int, int]]  # output topic -> (pending, lost)
    unreadable: int | None = None  # state records skipped (the exporter's; None elsewhere)


@dataclass
class Health:
    """Thread-safe."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _up: bool = True
    _batches: int = 0
    _observations: int = 0
    _last_batch_s: float | None = None
    _deadletters: dict[str, int] = field(default_factory=dict, repr=False)
    _outputs: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    _unreadable: int | None = None
    # read at every snapshot when set (the job's producer: pending now, not as of the last batch)
    _outputs_source: Callable[[], dict[str, tuple[int, int]]] | None = field(default=None, repr=False)

    def set_up(self, up: bool) -> None:
        """Whether the feeding side (job, state-topic consumer) is healthy."""
        with self._lock:
            self._up = up

    def record_batch(self, duration_s: float, observations: int, deadletters_by_reason: dict[str, int]) -> None:
        """One micro-batch of the streaming job is done."""
        with self._lock:
            self._batches += 1
            self._observations += observations
            self._last_batch_s = duration_s
            for reason, n in deadletters_by_reason.items():
                self._deadletters[reason] = self._deadletters.get(reason, 0) + n

    def declare_deadletter_reasons(self, reasons: Iterable[str]) -> None:
        """Serve the dead-letter counter at 0 for every reason the feeding side
        knows, so a dashboard by reason has series before the first rejection
        (and a rate sees the first one)."""
        with self._lock:
            for reason in reasons:
                self._deadletters.setdefault(reason, 0)

    def count_unreadable(self, n: int = 1) -> None:
        """``n`` more state records the exporter could not read (0: served from 0)."""
        with self._lock:
            self._unreadable = (self._unreadable or 0) + n

    def set_outputs(self, outputs: dict[str, tuple[int, int]]) -> None:
        """The job's output topics: topic -> (records pending, records lost so far)."""
        with self._lock:
            self._outputs = dict(outputs)

    def read_outputs_from(self, source: Callable[[], dict[str, tuple[int, int]]]) -> None:
        """Read the output topics' counts from ``source`` at every snapshot (a scrape): a
        record counted as pending is one still unacknowledged when /metrics is read."""
        with self._lock:
            self._outputs_source = source

    def snapshot(self) -> HealthSnapshot:
        source = self._outputs_source
        if source is not None:
            outputs = source()  # outside the lock: it may serve the producer's delivery reports
            with self._lock:
                self._outputs = dict(outputs)
        with self._lock:
            return HealthSnapshot(
                up=self._up,
                batches=self._batches,
                observations=self._observations,
                last_batch_s=self._last_batch_s,
                deadletters=dict(self._deadletters),
                outputs=dict(self._outputs),
                unreadable=self._unreadable,
            )
