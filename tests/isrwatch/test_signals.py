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
