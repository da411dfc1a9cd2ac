"""isrwatch.logs: the filter that holds back the Kafka clients' repeated messages, and the
logging of the Python processes Spark starts."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

from isrwatch.logs import RepeatFilter, worker_logging


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


def _confwarns(logger: logging.Logger, clients: int) -> list[str]:
    """What ``logger`` emits while ``clients`` real librdkafka consumers with Kafka 0.9's
    settings are made and closed (no broker needed: librdkafka checks its configuration
    when the client is made)."""
    from confluent_kafka import Consumer

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    keep = Keep()
    logger.addHandler(keep)
    try:
        for _ in range(clients):
            c = Consumer(
                {
                    "bootstrap.servers": "127.0.0.1:9",
                    "group.id": "confwarn",
                    "api.version.request": False,
                    "broker.version.fallback": "0.9.0.1",
                    "logger": logger,
                }
            )
            c.close()
    finally:
        logger.removeHandler(keep)
    return [line for line in lines if "CONFWARN" in line]


def test_librdkafka_configuration_warnings_are_shown_once_per_process_not_per_client() -> None:
    # the loggers isrwatch hands its clients carry the filter (isrwatch.logs, imported above)
    shown = _confwarns(logging.getLogger("librdkafka"), clients=5) + _confwarns(logging.getLogger("librdkafka"), 5)
    # the control: the same clients on a logger without the filter repeat them for each client
    bare = _confwarns(logging.getLogger("test.librdkafka.bare"), clients=5)
    assert len(bare) >= 5 * 2, bare  # api.version.request and broker.version.fallback, each client
    distinct = {line.split("]", 1)[1] for line in bare}
    assert len(shown) <= len(distinct), shown


def test_other_messages_of_the_clients_are_not_held_by_the_configuration_filter() -> None:
    from isrwatch.logs import ConfigWarningsOnce

    f = ConfigWarningsOnce()
    warn = "CONFWARN [rdkafka#consumer-%d] [thrd:app]: Configuration property api.version.request is deprecated"
    assert f.filter(_record("librdkafka", warn, 1))
    assert not f.filter(_record("librdkafka", warn, 2))  # another client, the same warning
    assert all(f.filter(_record("librdkafka", "FAIL [rdkafka#consumer-%d] connection refused", i)) for i in range(3))


def test_a_process_spark_starts_logs_isrwatch_warnings_in_the_job_s_format() -> None:
    """A fresh interpreter, as Spark starts one for the Kafka source's planning or an executor's
    Python worker: its warnings with time, level and logger, nothing below WARNING."""
    code = (
        "import logging\n"
        "from isrwatch.logs import worker_logging\n"
        "worker_logging(); worker_logging()\n"
        "log = logging.getLogger('streaming.watermarks')\n"
        "log.warning('event=telemetry_partitions_late partitions=t[0]')\n"
        "log.info('event=not_shown')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # once: a second call adds no handler
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING streaming.watermarks event=telemetry_partitions_late partitions=t\[0\]",
        lines[0],
    ), lines[0]


def test_a_process_with_its_logging_set_up_is_left_as_it_is() -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    marker = logging.NullHandler()
    root.addHandler(marker)
    try:
        worker_logging()
        assert root.handlers == [*before[0], marker] and root.level == before[1]
    finally:
        root.removeHandler(marker)


def test_the_job_s_log_follows_stderr_replaced_after_it_was_set_up(monkeypatch) -> None:
    """A process that replaces ``sys.stderr`` after logging was set up (pytest's capture between
    tests did, and each later line was a "Logging error: I/O operation on closed file") has
    the lines written to the stream it has now."""
    import io

    from isrwatch.logs import setup_logging

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        setup_logging("INFO")
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        logging.getLogger("streaming.test").info("event=one")
        first.close()  # as a finished test's capture is
        now = io.StringIO()
        monkeypatch.setattr(sys, "stderr", now)
        logging.getLogger("streaming.test").info("event=two")
        assert now.getvalue().endswith("INFO streaming.test event=two\n"), now.getvalue()
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
