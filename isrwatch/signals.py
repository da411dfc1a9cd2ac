"""SIGTERM and Ctrl-C, one way for every long-running command: ask it to stop, cleanly.

``StopSignals`` installs handlers for SIGTERM and SIGINT that set its ``stop`` event (and call
``on_stop`` once, with the signal), so a command's loop ends and its clean-up runs, whichever
signal came; a second Ctrl-C gives up waiting (KeyboardInterrupt). Leaving the ``with`` block
puts back the handlers it replaced (a process that embeds the command, a test, has its own
again). Off the main thread, where Python allows no handler, it installs nothing.

The handler itself takes no lock: Python runs it in the main thread between two bytecodes,
possibly while that thread holds the very lock the stop event's ``set`` needs (inside
``Event.wait``, which a command's loop calls every second), and the command then hangs on its
own stop. So the handler only notes the signal and wakes one thread (a byte down a pipe), which
logs it, calls ``on_stop`` and sets the event.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import deque
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
    ``on_stop(signum)`` runs once, on the module's signal thread, before the event is set: keep
    it short (ask a server to stop, note the signal)."""

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
        self._wake = -1  # the signal thread's pipe (``install``)

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._wake = _signal_thread()
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
        # (no lock here, nor in what it calls: see the module's docstring; is_set takes none)
        stopping = self.signalled is not None or self.stop.is_set()
        if signum == signal.SIGINT and stopping:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the clean stop
        if stopping:
            return
        self.signalled = signum
        _pending.append((self, signum))  # (a deque's append takes no Python lock)
        os.write(self._wake, b"\0")

    def _stop_now(self, signum: int) -> None:
        """On the signal thread: what the signal asks for."""
        log.info(kv(event=f"{self._name}_stopping", signal=signal.Signals(signum).name))
        if self._on_stop is not None:
            self._on_stop(signum)
        self.stop.set()


# Signals handed from the handlers to the one thread that acts on them, which a byte down
# the pipe wakes (started by the first ``install``, for the life of the process).
_pending: deque[tuple[StopSignals, int]] = deque()
_pipe: tuple[int, int] | None = None
_pipe_lock = threading.Lock()


def _signal_thread() -> int:
    """The write end of the signal thread's pipe, the thread started on first use."""
    global _pipe
    with _pipe_lock:
        if _pipe is None:
            _pipe = os.pipe()
            threading.Thread(target=_act_on_signals, args=(_pipe[0],), name="isrwatch-signals", daemon=True).start()
        return _pipe[1]


def _forget_the_thread() -> None:
    """In a forked child: the parent's thread is not there, its pipe and lock are the parent's."""
    global _pipe, _pipe_lock
    _pipe, _pipe_lock = None, threading.Lock()
    _pending.clear()


os.register_at_fork(after_in_child=_forget_the_thread)


def _act_on_signals(read_fd: int) -> None:
    while os.read(read_fd, 1):
        while _pending:
            signals, signum = _pending.popleft()
            try:
                signals._stop_now(signum)
            except Exception:  # an on_stop that fails must not end the thread: the stop is still set
                log.exception(kv(event="stop_callback_failed", signal=signal.Signals(signum).name))
                signals.stop.set()
