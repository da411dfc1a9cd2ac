"""Logging set-up: key=value messages on stderr (stdout carries alert JSON)."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["setup_logging", "worker_logging", "kv", "RepeatFilter", "ConfigWarningsOnce", "LIBRARY_LOGGERS"]


def kv(**fields: object) -> str:
    """Format fields as ``key=value`` pairs, floats to 3 significant places."""
    parts = []
    for k, v in fields.items():
        if isinstance(v, float):
            v = f"{v:.3g}"
        parts.append(f"{k}={v}")
    return " ".join(parts)


# The Kafka clients' loggers: a broker that does not answer makes them log the same
# failure many times a second (289 lines in 15 s against a closed port, measured).
LIBRARY_LOGGERS = ("librdkafka", "kafka", "exporter.librdkafka")


class RepeatFilter(logging.Filter):
    """Lets the first of a run of like messages from the Kafka clients through and
    holds the rest back for ``window_s``; the next one after that says how many were
    held. Like: same logger, level and text once digits are masked."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # key -> (shown at, held since)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(LIBRARY_LOGGERS):
            return True
        key = (record.name, record.levelno, _DIGITS.sub("#", record.getMessage()))
        now = self.clock()
        shown = self._seen.get(key)
        if shown is not None and now - shown[0] < self.window_s:
            self._seen[key] = (shown[0], shown[1] + 1)
            return False
        if len(self._seen) > 1000:  # bounded: forget the oldest
            for k in sorted(self._seen, key=lambda k: self._seen[k][0])[:500]:
                del self._seen[k]
        held = shown[1] if shown is not None else 0
        self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} like it held back in the last {self.window_s:.0f}s)"
            record.args = None
        return True


_DIGITS = re.compile(r"\d+")


class ConfigWarningsOnce(logging.Filter):
    """librdkafka warns about a client's configuration (``CONFWARN``) each time a client is
    made, and isrwatch makes clients all the time (the job's source asks every few seconds,
    from Spark's Python workers, where ``setup_logging`` never ran): the settings Kafka 0.9
    needs (``api.version.request``, ``broker.version.fallback``: docs/kafka.md) gave two
    ten-line deprecation warnings per client, hundreds an hour. Each such warning is let
    through once per process (the text with the client's name and numbers masked); every
    other record passes."""

    def __init__(self, limit: int = 1000) -> None:
        super().__init__()
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "CONFWARN" not in text:
            return True
        key = _DIGITS.sub("#", text)
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) < self.limit:  # bounded; past it, warnings pass
                self._seen.add(key)
        return True


# On the loggers themselves, so it holds wherever the clients log, set up or not.
for _name in LIBRARY_LOGGERS:
    logging.getLogger(_name).addFilter(ConfigWarningsOnce())


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set up: a
    process that replaces it later (a test run's capture, a tool redirecting it) gets the
    lines, where a handler holding the old stream wrote to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Py4J and Spark's Python side are chatty at INFO.
    for noisy in ("py4j", "py4j.clientserver", "kafka", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def worker_logging() -> None:
    """Logging for isrwatch's code in a Python process Spark starts (the runner of the Kafka
    source's planning, an executor's Python worker), where ``setup_logging`` never ran: its
    warnings in the job's own format (time, level, logger) on stderr, where they came out as
    the bare message of Python's last-resort handler. Nothing changes in a process whose
    logging is set up already (the job's driver, a test run)."""
    if logging.getLogger().handlers:
        return
    setup_logging("WARNING")
