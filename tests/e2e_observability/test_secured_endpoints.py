"""``--web-config-file`` end to end: ``isrwatch exporter`` (on the session's real Kafka) and
``isrwatch run`` (a child process on the embedded simulator) behind TLS and basic auth,
scraped by a real Prometheus over HTTPS with the password: ``up`` is 1 for both. The same
targets scraped with a wrong password, or over plain HTTP, are down; a direct request
without the password gets 401 and ``WWW-Authenticate``, one over plain HTTP no answer."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from exporter.main import Exporter
from exporter.settings import ExporterSettings
from isrwatch.settings import build
from localkafka import free_port
from localservices import Service, binary, prometheus
from tests.e2e_observability.running_job import JobProcess, running_job
from tests.support.webconfig import PASSWORD, USER, web_config

pytestmark = [
    pytest.mark.services,
    pytest.mark.spark,
    pytest.mark.skipif(binary("prometheus") is None, reason="prometheus not installed (Debian package)"),
]


def scrape_config(name: str, target: str, ca_file: Path, *, password: str | None, scheme: str = "https") -> dict:
    config: dict[str, Any] = {"job_name": name, "scheme": scheme, "static_configs": [{"targets": [target]}]}
    if scheme == "https":
        config["tls_config"] = {"ca_file": str(ca_file)}
    if password is not None:
        config["basic_auth"] = {"username": USER, "password": password}
    return config


def up(prom: Service) -> dict[str, float]:
    body = requests.get(f"{prom.url}/api/v1/query", params={"query": "up"}, timeout=10).json()
    return {r["metric"]["job"]: float(r["value"][1]) for r in body["data"]["result"]}


def until(what: str, ready: Callable[[], bool], timeout_s: float, job: JobProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not job.running():
            raise AssertionError(f"isrwatch run exited while waiting for {what}:\n{job.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s}s:\n{job.log_tail()}")
        time.sleep(0.5)


def answers(url: str, ca_file: Path) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(url, auth=(USER, PASSWORD), verify=str(ca_file), timeout=2).status_code == 200
    return False


def test_prometheus_scrapes_the_secured_exporter_and_job_and_a_wrong_password_is_refused(
    kafka_cluster: Any, unique_name: Callable, tmp_path: Path
) -> None:
    config = web_config(tmp_path)
    ca_file = tmp_path / "server.crt"
    state_topic = unique_name("state")
    kafka_cluster.create_topic(state_topic, partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})
    settings = build(
        ExporterSettings,
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        kafka_config=[f"{k}={v}" for k, v in kafka_cluster.client_config().items() if k != "bootstrap.servers"],
        state_topic=state_topic,
        host="127.0.0.1",
        port=free_port(),
        web_config_file=str(config),
    )
    job_port = free_port()
    job_args = ["--simulate", "steady", "--web-config-file", str(config), "--checkpoint-dir", str(tmp_path / "ckpt")]
    with Exporter(settings) as exporter, running_job(job_args, tmp_path, job_port) as job:
        assert exporter.server is not None and exporter.server.url.startswith("https://")
        exporter_target = f"127.0.0.1:{exporter.server.port}"
        job_target = f"127.0.0.1:{job_port}"
        job_url = f"https://{job_target}/metrics"
        until("the job's /metrics over HTTPS", lambda: answers(job_url, ca_file), 180, job)

        # Directly: no password is 401 with a challenge; plain HTTP gets no answer.
        for url in (exporter.server.url, job_url):
            refused = requests.get(url, verify=str(ca_file), timeout=5)
            assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic"), url
            with pytest.raises(requests.ConnectionError):
                requests.get(url.replace("https://", "http://"), auth=(USER, PASSWORD), timeout=5)

        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        scrape = [
            scrape_config("exporter", exporter_target, ca_file, password=PASSWORD),
            scrape_config("job", job_target, ca_file, password=PASSWORD),
            scrape_config("exporter-wrong-password", exporter_target, ca_file, password="wrong"),
            scrape_config("job-wrong-password", job_target, ca_file, password="wrong"),
            scrape_config("job-no-password", job_target, ca_file, password=None),
            scrape_config("exporter-plain-http", exporter_target, ca_file, password=PASSWORD, scheme="http"),
            scrape_config("job-plain-http", job_target, ca_file, password=PASSWORD, scheme="http"),
        ]
        prom_config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": scrape}
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        with prometheus(prom_dir / "prometheus.yml", prom_dir) as prom:
            until("a scrape of every target", lambda: len(up(prom)) == len(scrape), 60, job)
            until("both secured targets up", lambda: up(prom)["exporter"] == up(prom)["job"] == 1, 30, job)
            got = up(prom)
            assert got == {c["job_name"]: (1.0 if c["job_name"] in ("exporter", "job") else 0.0) for c in scrape}, got
            # What Prometheus stored from the secured targets is isrwatch's own series.
            body = requests.get(f"{prom.url}/api/v1/query", params={"query": "isrwatch_up"}, timeout=10).json()
            assert {r["metric"]["job"] for r in body["data"]["result"]} >= {"exporter", "job"}
            targets = requests.get(f"{prom.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            errors = {t["labels"]["job"]: t["lastError"] for t in targets}
            assert "401" in errors["exporter-wrong-password"] and "401" in errors["job-no-password"], errors
    assert PASSWORD not in job.log_tail(1_000_000)
