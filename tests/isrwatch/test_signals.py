"""isrwatch.signals.StopSignals: the one way a long-running command stops on SIGTERM and Ctrl-C."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from isrwatch.signals import StopSignals


def test_sigterm_and_sigint_set_the_stop_once_and_the_handlers_come_back(caplog: pytest.LogCaptureFixture) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    called: list[int] = []
    signals = StopSignals(called.append, name="collector")
    with caplog.at_level("INFO"), signals as stop:
        assert signal.getsignal(signal.SIGTERM) != before[0]
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
    assert called == [signal.SIGTERM] and signals.signalled == signal.SIGTERM
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert [r.getMessage() for r in caplog.records].count("event=collector_stopping signal=SIGTERM") == 1


def test_a_second_ctrl_c_gives_up_waiting() -> None:
    shared = threading.Event()
    with StopSignals(name="job", event=shared) as stop:
        assert stop is shared
        os.kill(os.getpid(), signal.SIGINT)
        assert shared.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            shared.wait(5)  # (the handler raises here, in the main thread)


def test_off_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def run() -> None:
        with StopSignals(name="embedded"):
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) == before


# A signal handled while the main thread holds the stop event's own lock: Python runs handlers
# between bytecodes, and a command's loop sits in ``Event.wait`` every second, which holds that
# lock for a few bytecodes on each entry and exit. Holding it here opens that window on purpose
# (``_cond`` is Event's private Condition; a real stop hit it once in a CI run: `isrwatch
# local-kafka` never exited after Ctrl-C). In a subprocess, so the old handler's hang is a
# timeout here, not a hung test run.
_SIGNAL_INSIDE_WAIT = """
import os, signal, sys
from isrwatch.signals import StopSignals
with StopSignals(name="probe") as stop:
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes for the handler to run between
            pass
    print("stopped" if stop.wait(10) else "not stopped", flush=True)
"""


def test_a_signal_while_the_main_thread_holds_the_stop_events_lock_still_stops() -> None:
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", _SIGNAL_INSIDE_WAIT], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the command hung: its signal handler waited on a lock its own thread held")
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stdout + done.stderr
