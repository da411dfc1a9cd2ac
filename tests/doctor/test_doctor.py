"""``isrwatch doctor`` against the real thing (issue 18): a real 3-broker Kafka 0.9
cluster with isrwatch's topics laid out as docs/deploy.md says, the real collector
feeding telemetry, a real exporter and a real Alertmanager. Healthy, every row
passes; then each fault the issue names is named in its row, with a non-zero exit,
within 30 s: a broker paused, a missing telemetry topic, another cluster's
checkpoint, Alertmanager stopped, a bootstrap address where nothing listens.

The doctor runs as the user runs it: ``python -m isrwatch doctor ... --format json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from localkafka import free_port
from localservices import Alertmanager
from streaming.lifecycle.origin import check_origin, kafka_origin
from tests.e2e.pipeline import Pipeline, until

LAG_MS = 10_000


def doctor(pipe: Pipeline, *extra: str, bootstrap: str | None = None) -> tuple[int, dict[str, dict], float]:
    """(exit code, rows by check, seconds) of one ``isrwatch doctor`` run."""
    argv = [
        sys.executable,
        "-m",
        "isrwatch",
        "doctor",
        "--bootstrap-servers",
        bootstrap or pipe.cluster.bootstrap_servers,
        *pipe.cluster.kafka_config_flags(),
        "--telemetry-topic",
        pipe.telemetry_topic,
        "--state-topic",
        pipe.state_topic,
        "--alerts-topic",
        pipe.alerts_topic,
        "--deadletter-topic",
        pipe.deadletter_topic,
        "--lag-time-max-ms",
        str(LAG_MS),
        "--format",
        "json",
        *extra,
    ]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] == (done.returncode == 0)
    return done.returncode, {r["check"]: r for r in report["checks"]}, took


def failed(rows: dict[str, dict]) -> set[str]:
    return {name for name, r in rows.items() if r["status"] == "fail"}


def test_doctor_passes_a_healthy_path_and_names_each_fault(kafka_cluster_factory, tmp_path) -> None:
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=60_000)
    cluster.create_topic("orders", partitions=3, replication_factor=3)  # the watched topic: followers to observe
    pipe = Pipeline(cluster, tmp_path)
    pipe.create_topics()
    pipe.start_collector()
    pipe.start_exporter()
    am = Alertmanager().start()
    checkpoint = tmp_path / "checkpoint"
    try:
        exporter_url = f"http://127.0.0.1:{pipe.exporter_port}"

        def exporter_up() -> bool:
            try:
                with urllib.request.urlopen(exporter_url + "/metrics", timeout=2) as r:
                    return b"\nisrwatch_up 1.0" in r.read()
            except OSError:
                return False

        until("the exporter to reach the state topic", exporter_up, 60, pipe)
        common = ["--alertmanager-url", am.url, "--exporter-url", exporter_url, "--checkpoint-dir", str(checkpoint)]

        # Healthy: every row passes (the collector's telemetry is fresh, the topics spread over the brokers).
        def healthy() -> bool:
            rc, rows, _ = doctor(pipe, *common)
            return rc == 0 and rows["newest telemetry"]["status"] == "ok"

        until("the collector's first telemetry", healthy, 60, pipe)
        rc, rows, took = doctor(pipe, *common)
        assert rc == 0, rows
        assert {r["status"] for r in rows.values()} == {"ok"}, rows
        assert {f"broker {b} (telemetry cluster)" for b in (1, 2, 3)} <= set(rows)
        assert took < 30

        # Another cluster's checkpoint (same topic name), recorded by the job's own code.
        other = tmp_path / "other-checkpoint"
        check_origin(str(other), kafka_origin("kafka-elsewhere:9092", pipe.telemetry_topic, None))
        rc, rows, took = doctor(pipe, "--checkpoint-dir", str(other))
        assert rc != 0 and failed(rows) == {"checkpoint"}, rows
        assert "kafka-elsewhere:9092" in rows["checkpoint"]["found"]
        assert took < 30

        # A telemetry topic that does not exist.
        rc, rows, took = doctor(pipe, "--telemetry-topic", "isr.telemetry-missing")
        assert rc != 0 and "telemetry topic isr.telemetry-missing" in failed(rows), rows
        assert took < 30

        # Alertmanager stopped.
        am.stop()
        rc, rows, took = doctor(pipe, "--alertmanager-url", am.url)
        assert rc != 0 and failed(rows) == {"alertmanager"}, rows
        assert took < 30

        # A broker paused: named in its own row, the others answer.
        # It is the first bootstrap server too: the doctor must go on to the others.
        bootstrap = ",".join(cluster.address(b) for b in (2, 1, 3))
        cluster.pause(2)
        try:
            rc, rows, took = doctor(pipe, bootstrap=bootstrap)
        finally:
            cluster.resume(2)
        assert rc != 0 and "broker 2 (telemetry cluster)" in failed(rows), rows
        assert "did not answer" in rows["broker 2 (telemetry cluster)"]["found"]
        assert rows["broker 1 (telemetry cluster)"]["status"] == "ok", rows
        assert rows["telemetry cluster"]["status"] == "warn", rows  # reached through broker 1 or 3
        assert took < 30

        # A bootstrap address where nothing listens.
        nobody = f"127.0.0.1:{free_port()}"
        rc, rows, took = doctor(pipe, bootstrap=nobody)
        assert rc != 0 and nobody in rows["telemetry cluster"]["found"], rows
        assert took < 30
    finally:
        am.close()
        pipe.close()


@pytest.mark.parametrize("fmt", ["table"])
def test_the_table_says_what_failed_and_what_to_do(fmt, tmp_path) -> None:
    """No Kafka at all: one row names the address, the summary line names the failed check."""
    nobody = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "isrwatch",
            "doctor",
            "--bootstrap-servers",
            nobody,
            "--timeout-seconds",
            "2",
            "--checkpoint-dir",
            str(tmp_path / "ck"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done
    assert "CHECK" in done.stdout and "WHAT TO DO" in done.stdout
    assert nobody in done.stdout and "failed: telemetry cluster" in done.stdout
    assert "Traceback" not in done.stderr


def test_settings_the_protocol_client_cannot_use_are_refused_at_start(tmp_path) -> None:
    """A PKCS#12 keystore: refused at start-up (the job's settings), naming the key, not its value."""
    nobody = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "doctor", "--bootstrap-servers", nobody, "--timeout-seconds", "2",
         "--kafka-config", "ssl.keystore.password=hunter2", "--checkpoint-dir", str(tmp_path / "ck")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("isrwatch doctor: error: --kafka-config ssl.keystore.password"), err
    assert "PKCS#12" in err[0] and "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"# HELP x\nisrwatch_up 1\n", "ok", "isrwatch_up 1"),
        (b"isrwatch_up 0\n", "fail", "isrwatch_up is 0"),
        (b"process_cpu_seconds_total 3\n", "fail", "without isrwatch_up"),
        (b"isrwatch_up \n", "fail", "not a sample"),  # was an IndexError: a traceback from doctor
        (b"isrwatch_up one\n", "fail", "not a sample"),
        (b"\xff\xfeisrwatch_up\n", "fail", "without isrwatch_up"),
    ],
)
def test_a_metrics_page_is_judged_by_its_isrwatch_up_line(body: bytes, status: str, says: str) -> None:
    from doctor.checks import _metrics_found

    got, text = _metrics_found(body)
    assert (got.lower(), says in text) == (status, True), (got, text)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"versionInfo": {"version": "0.27.0"}, "cluster": {"status": "ready"}}', "ok"),
        (b"<html>a proxy's login page</html>", "fail"),
        (b"[" * 100_000 + b"]" * 100_000, "fail"),  # (was a RecursionError out of isrwatch doctor)
        (b'{"versionInfo": NaN}', "fail"),
        (b"[1, 2]", "fail"),
    ],
)
def test_an_alertmanager_answer_is_judged_without_a_traceback(body: bytes, status: str) -> None:
    from doctor.checks import _am_found

    assert _am_found(body)[0].lower() == status
