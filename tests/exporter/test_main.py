"""``isrwatch exporter`` start-up errors (nothing started)."""

from __future__ import annotations

import pytest

from isrwatch.cli import main as cli_main
from localkafka import free_port


def test_unreachable_kafka_is_one_clear_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    rc = cli_main(["exporter", "--bootstrap-servers", f"127.0.0.1:{port}", "--startup-timeout", "2", "--port", "0"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"isrwatch exporter: error: cannot reach Kafka at 127.0.0.1:{port} within 2s")
    assert not any("Traceback" in line for line in err)


def test_bootstrap_servers_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["exporter", "--port", "0"]) == 2
    assert "--bootstrap-servers is required" in capsys.readouterr().err


def test_bad_replica_series_choice(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["exporter", "--bootstrap-servers", "127.0.0.1:1", "--replica-series", "some"])
    assert rc == 2
    assert "'some' is not one of: all, not-ok" in capsys.readouterr().err


def test_bad_partition_series_choice(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["exporter", "--bootstrap-servers", "127.0.0.1:1", "--partition-series", "risky"])
    assert rc == 2
    assert "'risky' is not one of: all, at-risk" in capsys.readouterr().err


def test_the_consuming_loop_outlives_an_unexpected_error(caplog: pytest.LogCaptureFixture) -> None:
    """A unit test of the loop alone (its poll replaced; nothing connects): an error no bad
    record explains is logged with its traceback and the loop goes on, since the thread is the
    gauges' only feed (the bad records themselves: tests/exporter/test_exporter_kafka.py)."""
    import threading

    from exporter.consumer import StateTopicConsumer
    from exporter.store import StatusStore

    stop = threading.Event()
    polls: list[int] = []

    class Flaky(StateTopicConsumer):
        def poll(self, timeout_s: float = 1.0, max_records: int = 1000) -> int:
            polls.append(1)
            if len(polls) == 1:
                raise RuntimeError("something no one foresaw")
            stop.set()
            return 0

    consumer = Flaky({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, "isr.replica-state", StatusStore())
    try:
        consumer.run(stop)
    finally:
        consumer.close()
    assert len(polls) == 2 and consumer.errors == 1
    [record] = [r for r in caplog.records if "event=state_consumer_error" in r.getMessage()]
    assert record.exc_info is not None and "something no one foresaw" in str(record.exc_info[1])
