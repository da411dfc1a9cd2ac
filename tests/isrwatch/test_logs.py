"""isrwatch.logs: the filter that holds back the Kafka clients' repeated messages."""

from __future__ import annotations

import logging

from isrwatch.logs import RepeatFilter


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args or None, None)


def test_a_client_repeating_itself_is_shown_once_per_window_with_the_count_held() -> None:
    now = [0.0]
    f = RepeatFilter(window_s=30, clock=lambda: now[0])
    fail = "Connect to ipv4#127.0.0.1:%d failed: Connection refused (after %dms in state CONNECT)"
    assert f.filter(_record("librdkafka", fail, 1, 0))
    shown = sum(f.filter(_record("librdkafka", fail, 1, ms)) for ms in range(288))
    assert shown == 0  # the digits differ, the failure does not
    assert f.filter(_record("librdkafka", "another failure"))  # a different message passes
    now[0] = 31.0
    later = _record("librdkafka", fail, 1, 0)
    assert f.filter(later)
    assert later.getMessage().endswith("(288 like it held back in the last 30s)")


def test_isrwatch_own_lines_are_never_held_back() -> None:
    f = RepeatFilter(window_s=30, clock=lambda: 0.0)
    assert all(f.filter(_record("streaming.job", "batch batch_id=%d", i)) for i in range(5))
    assert all(f.filter(_record("collector.main", "collector_progress rounds=1")) for _ in range(3))
