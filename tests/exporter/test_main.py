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
