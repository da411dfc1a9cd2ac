"""SIGTERM and Ctrl-C, one way for every long-running command: ask it to stop, cleanly.

``StopSignals`` installs handlers for SIGTERM and SIGINT that set its ``stop`` event (and call
``on_stop`` once, with the signal), so a command's loop ends and its clean-up runs, whichever
signal came; a second Ctrl-C gives up waiting (KeyboardInterrupt). Leaving the ``with`` block
puts back the handlers it replaced (a process that embeds the command, a test, has its own
again). Off the main thread, where Python allows no handler, it installs nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from isrwatch.logs import kv

__all__ = ["StopSignals"]

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """``with StopSignals(name="collector") as stop: while not stop.wait(1): ...``: the event is
    set on the first SIGTERM or SIGINT, logged as ``event=<name>_stopping signal=SIGTERM``.
    ``on_stop(signum)`` runs once, in the handler, before the event is set: keep it short
    (ask a server to stop, note the signal)."""

    def __init__(
        self,
        on_stop: Callable[[int], None] | None = None,
        *,
        name: str = "isrwatch",
        event: threading.Event | None = None,
    ) -> None:
        self.stop = event or threading.Event()  # ``event``: one the command already waits on
        self.signalled: int | None = None  # the first signal that asked for the stop
        self._on_stop = on_stop
        self._name = name
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous = {}

    def __enter__(self) -> threading.Event:
        self.install()
        return self.stop

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.stop.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the clean stop
        if self.stop.is_set():
            return
        self.signalled = signum
        log.info(kv(event=f"{self._name}_stopping", signal=signal.Signals(signum).name))
        if self._on_stop is not None:
            self._on_stop(signum)
        self.stop.set()
