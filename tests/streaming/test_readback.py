"""``streaming.driver.readback.ReadBack``: the timer asks, the read runs on its own thread."""

from __future__ import annotations

import threading

from streaming.driver.readback import ReadBack


def _reader(read):
    took, failed = [], []
    rb = ReadBack(read, lambda a, f: took.append((a, f)), lambda a, e: failed.append((a, type(e).__name__)), "t")
    return rb, took, failed


def test_one_read_at_a_time_and_its_result_taken_in() -> None:
    release = threading.Event()

    def read(asked):
        release.wait(30)
        return asked * 2

    rb, took, failed = _reader(read)
    assert rb.ask(1)
    assert not rb.ask(2), "a read is under way"
    release.set()
    assert rb.wait(30)
    assert took == [(1, 2)] and failed == []
    assert rb.ask(3) and rb.wait(30)
    assert took == [(1, 2), (3, 6)]
    rb.close(30)


def test_a_failed_read_is_said_and_the_next_ask_reads_again() -> None:
    calls = []

    def read(asked):
        calls.append(asked)
        if len(calls) == 1:
            raise FileNotFoundError("replicas/v3")
        return "found"

    rb, took, failed = _reader(read)
    assert rb.ask("a") and rb.wait(30)
    assert failed == [("a", "FileNotFoundError")] and took == []
    assert rb.ask("a") and rb.wait(30)
    assert took == [("a", "found")]
    rb.close(30)


def test_a_failure_taking_a_result_in_does_not_end_the_reader(caplog) -> None:
    taken = []

    def take(asked, found):
        taken.append(asked)
        if asked == "bad":
            raise ValueError("merge")

    rb = ReadBack(lambda a: a, take, lambda a, e: None, "t")
    assert rb.ask("bad") and rb.wait(30)
    assert "read_back_failed" in caplog.text
    assert rb.ask("good") and rb.wait(30)
    assert taken == ["bad", "good"]
    rb.close(30)


def test_closed_it_reads_no_more_and_its_thread_ends() -> None:
    rb, took, _ = _reader(lambda a: a)
    assert rb.ask(1) and rb.wait(30)
    thread = rb._thread
    rb.close(30)
    assert thread is not None and not thread.is_alive()
    assert not rb.ask(2) and took == [(1, 1)]


def test_never_asked_it_starts_no_thread() -> None:
    rb, _, _ = _reader(lambda a: a)
    rb.close(1)
    assert rb._thread is None
