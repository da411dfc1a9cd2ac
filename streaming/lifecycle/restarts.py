"""When the job starts its failed query again, and when it gives up (``RestartPolicy``).

A query can fail for a reason that passes: Spark gives the Python worker that runs the
job's source 10 s to start and connect back, which a loaded machine can miss, and a
standalone cluster can lose an executor. The job then starts the query again from its
checkpoint in the same process (``streaming.lifecycle.job.Job``): its batches resume after the
last committed one, which the monitor and the outputs have already handled. A failure
that does not pass (a full disk, a bug) must still end the job with its reason, so the
restarts are bounded: at most ``attempts`` within ``window_s``, the first after
``backoff_s``, each wait doubled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RestartPolicy", "QUERY_RESTARTS", "QUERY_RESTART_WINDOW_S", "QUERY_RESTART_BACKOFF_S"]

QUERY_RESTARTS = 5
QUERY_RESTART_WINDOW_S = 600.0
QUERY_RESTART_BACKOFF_S = 2.0


@dataclass
class RestartPolicy:
    attempts: int = QUERY_RESTARTS
    window_s: float = QUERY_RESTART_WINDOW_S
    backoff_s: float = QUERY_RESTART_BACKOFF_S
    _at: list[float] = field(default_factory=list, repr=False)  # when each restart within the window began

    def next_wait(self, now: float) -> float | None:
        """A failure at ``now`` (monotonic seconds): how long to wait before the restart it
        counts as, or None when ``attempts`` restarts began within ``window_s`` already."""
        self._at = [t for t in self._at if now - t < self.window_s]
        if len(self._at) >= self.attempts:
            return None
        self._at.append(now)
        return self.backoff_s * 2 ** (len(self._at) - 1)

    @property
    def count(self) -> int:
        """Restarts within the window as of the last failure (the log line's ``attempt``)."""
        return len(self._at)
