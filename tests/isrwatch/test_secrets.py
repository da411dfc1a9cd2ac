"""Issue 14, item 7: a secret given to isrwatch never comes out of it.

Every command that takes one is run as a user runs it (the console script, ``--log-level
DEBUG``) against the real local Kafka with a known secret as ``sasl.password`` and
``ssl.key.password`` (``--kafka-config``) and as the Alertmanager basic-auth password (an
Alertmanager that refuses connections, so delivery fails and is logged); then every output
is searched for it: stdout and stderr of each process, the job's and the exporter's
``/metrics``, and every record of the state, alerts and dead-letter topics. The brokers
listen on PLAINTEXT, so librdkafka and kafka-python hold the SASL/TLS passwords without
using them: what is checked is what isrwatch does with them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from localkafka import free_port
from tests.e2e.kafka_io import read_records
from tests.e2e.results import write_result

# make reliability and make campaign (~50 s: every command run with the secrets given); make test
# keeps secrets out of settings' text and the JMX flags' errors by unit test
# (tests/isrwatch/test_settings.py, tests/collector/test_jmx.py) and the secured endpoints on real
# Prometheus (tests/e2e_observability/test_secured_endpoints.py).
pytestmark = [pytest.mark.spark, pytest.mark.reliability, pytest.mark.campaign]

SECRET = f"s3cr3t-{uuid.uuid4().hex[:12]}"
ISRWATCH = [sys.executable, "-m", "isrwatch", "--log-level", "DEBUG"]


def _scrape(port: int, timeout_s: float, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the process ended before /metrics answered"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            if "isrwatch_" in text:
                return text
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"no /metrics on port {port} within {timeout_s}s")


def test_no_output_of_any_command_holds_the_secret(kafka_cluster, unique_name, tmp_path: Path) -> None:
    k = kafka_cluster
    topics = {n: unique_name(n) for n in ("telemetry", "state", "alerts", "dead")}
    for t in topics.values():
        k.create_topic(t, partitions=3, replication_factor=3)
    kafka = [
        "--bootstrap-servers", k.bootstrap_servers, *k.kafka_config_flags(),
        "--kafka-config", f"sasl.password={SECRET}", "--kafka-config", f"ssl.key.password={SECRET}",
    ]  # fmt: skip
    outputs: dict[str, str] = {}

    collect = subprocess.run(
        [*ISRWATCH, "collect", *kafka, "--telemetry-topic", topics["telemetry"], "--duration", "10", "--interval", "0.5"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stderr[-2000:]
    outputs["collect"] = collect.stdout + collect.stderr

    job_port, exporter_port = free_port(), free_port()
    job_log = tmp_path / "job.log"
    with job_log.open("w") as err:
        job = subprocess.Popen(
            [*ISRWATCH, "run", *kafka, "--telemetry-topic", topics["telemetry"], "--state-topic", topics["state"],
             "--alerts-topic", topics["alerts"], "--deadletter-topic", topics["dead"],
             "--checkpoint-dir", str(tmp_path / "ck"), "--starting-offsets", "earliest", "--stale-after-seconds", "5",
             "--metrics-port", str(job_port), "--alertmanager-url", f"http://127.0.0.1:{free_port()}",
             "--alertmanager-username", "isrwatch", "--alertmanager-password", SECRET],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    try:
        # The collector has stopped: the telemetry goes stale, the job raises IsrwatchTelemetryStale
        # and fails to deliver it to the Alertmanager that is not there (with the password).
        deadline = time.monotonic() + 240  # Spark's start on a loaded 2-core machine
        while "alertmanager_unreachable" not in job_log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, job_log.read_text()[-2000:]
            time.sleep(1)
        outputs["job /metrics"] = _scrape(job_port, 60, job)
        job.send_signal(signal.SIGTERM)
        out, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, job_log.read_text()[-2000:]
    outputs["run"] = out + job_log.read_text()

    exporter = subprocess.Popen(
        [*ISRWATCH, "exporter", *kafka, "--state-topic", topics["state"], "--host", "127.0.0.1",
         "--port", str(exporter_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        outputs["exporter /metrics"] = _scrape(exporter_port, 120, exporter)
    finally:
        exporter.terminate()
        out, err = exporter.communicate(timeout=60)
    outputs["exporter"] = out + err

    doctor = subprocess.run(
        [*ISRWATCH, "doctor", *kafka, "--telemetry-topic", topics["telemetry"], "--state-topic", topics["state"],
         "--alerts-topic", topics["alerts"], "--deadletter-topic", topics["dead"]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    outputs["doctor"] = doctor.stdout + doctor.stderr

    for name in ("state", "alerts", "dead"):
        records = read_records(k, topics[name], compacted=name == "state")
        outputs[f"topic {name}"] = "\n".join(repr(r) for r in records)
    assert len(outputs["topic state"]) > 0, "the job wrote no state: the run did not do its work"
    assert "newest telemetry" in outputs["doctor"], outputs["doctor"][-2000:]

    leaked = sorted(name for name, text in outputs.items() if SECRET in text)
    write_result("secrets", {"outputs_read": sorted(outputs), "outputs_holding_a_secret": leaked})  # issue 14, item 7
    assert not leaked, f"the secret appears in: {leaked}"
