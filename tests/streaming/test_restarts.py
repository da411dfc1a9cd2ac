"""streaming.lifecycle.restarts.RestartPolicy: when a failed query is started again (unit tests of its
logic; the job restarting a real query: tests/streaming/test_query_restart.py and
test_lifecycle.py)."""

from __future__ import annotations

from streaming.lifecycle.restarts import RestartPolicy


def test_restarts_wait_longer_each_time_and_stop_at_the_limit() -> None:
    policy = RestartPolicy(attempts=3, window_s=600.0, backoff_s=2.0)
    waits = [policy.next_wait(now) for now in (0.0, 10.0, 30.0, 70.0)]
    assert waits == [2.0, 4.0, 8.0, None]
    assert policy.count == 3


def test_failures_older_than_the_window_no_longer_count() -> None:
    policy = RestartPolicy(attempts=2, window_s=100.0, backoff_s=1.0)
    assert policy.next_wait(0.0) == 1.0
    assert policy.next_wait(50.0) == 2.0
    assert policy.next_wait(60.0) is None  # two within the last 100 s
    assert policy.next_wait(120.0) == 2.0  # the first is out of the window: one counts, this is the second
    assert policy.next_wait(151.0) == 2.0  # the one at 50 s is out too
    assert policy.count == 2


def test_the_defaults_are_what_the_job_has_always_used() -> None:
    policy = RestartPolicy()
    assert [policy.next_wait(float(t)) for t in range(6)] == [2.0, 4.0, 8.0, 16.0, 32.0, None]
