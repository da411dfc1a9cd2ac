"""Issue 4, done-when 2: a real Prometheus (Debian package, loopback) scrapes
the real job's in-process /metrics (``isrwatch run --spool-dir``, fed by
``isrwatch simulate --scenario stuck-follower --spool-dir``, two child
processes) with the shipped rules (deploy/prometheus/rules, evaluated every
second here instead of every 5 s).

* every panel query of every dashboard (tests/deploy/panels.py), and every
  dashboard variable's selector, returns at least one series during the run;
* the rule-based replica alerts fire (GET /api/v1/alerts) for the followers
  the simulated leaders really dropped from the ISR (the simulator's truth)
  and for no other replica, with the contract labels only, and resolve once
  the follower has caught up again.

Spark is warmed up first on a short throw-away cluster (whose telemetry then
stops: its replicas must stay quiet too), so that the scenario is seen from
its start even when Spark's first micro-batch takes a minute on a loaded
machine.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from localkafka import free_port
from localservices import Service, binary, prometheus
from tests.deploy.panels import DEPLOY, FLAPPING, RULES_FILE, panel_queries, rules_with_interval, variable_queries
from tests.e2e_observability.running_job import JobProcess, running_job

pytestmark = [
    # make campaign (~75 s of scenario after Spark's start): make test keeps a real Prometheus scraping
    # the job and the exporter (test_secured_endpoints.py) and the shipped rules run by promtool
    # (tests/deploy/test_prometheus.py).
    pytest.mark.campaign,
    pytest.mark.services,
    pytest.mark.spark,
    pytest.mark.skipif(binary("prometheus") is None, reason="prometheus not installed (Debian package)"),
]

LAG_ALERTS = ("KafkaReplicaNearingIsrShrink", "KafkaReplicaIsrShrinkImminent", "KafkaReplicaOutOfSync")
FAULTY = (("orders", "0", "3", "1"), ("payments", "0", "3", "1"))  # topic, partition, broker_id, leader_id
CONTRACT_LABELS = {"alertname", "severity", "cluster", "topic", "partition", "broker_id", "leader_id"}
REPLICA_LABELS = ("cluster", "topic", "partition", "broker_id", "leader_id")
SIM_S = 70
# After the scenario's 70 s, time for a loaded machine's job to catch up.
RUN_SLACK_S = 120


def query(prom: Service, expr: str) -> list[dict]:
    body = requests.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def firing_alerts(prom: Service) -> list[dict]:
    alerts = requests.get(f"{prom.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def prometheus_config(workdir: Path, job_port: int) -> Path:
    """The shipped prometheus.yml and rules, pointed at the job, sped up."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    config["alerting"] = {"alertmanagers": []}
    config["scrape_configs"] = [
        {"job_name": "isrwatch-job", "static_configs": [{"targets": [f"127.0.0.1:{job_port}"]}]},
    ]
    (workdir / "rules").mkdir()
    (workdir / "rules" / RULES_FILE.name).write_text(rules_with_interval("1s"))
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def simulate(spool: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "isrwatch", "simulate", "--spool-dir", str(spool), *args]


def wait_first_batch(job: JobProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not job.metrics().get(("isrwatch_job_batches_total", frozenset())):
        assert job.running(), job.log_tail()
        assert time.monotonic() < deadline, f"no micro-batch after {timeout_s}s:\n{job.log_tail()}"
        time.sleep(1)


@contextlib.contextmanager
def job_on_spool(tmp_path: Path, warmup_cluster: str) -> Iterator[tuple[Service, JobProcess, Path]]:
    """A real Prometheus scraping ``isrwatch run --spool-dir`` (the spool yielded), Spark warmed
    up on a short throw-away cluster ``warmup_cluster`` whose telemetry then stops."""
    spool = tmp_path / "spool"
    spool.mkdir()
    job_port = free_port()
    (tmp_path / "prometheus").mkdir()
    config = prometheus_config(tmp_path / "prometheus", job_port)
    args = ["--spool-dir", str(spool), "--lag-time-max-ms", "10000", "--checkpoint-dir", str(tmp_path / "checkpoint")]
    with prometheus(config, tmp_path / "prometheus") as prom, running_job(args, tmp_path, job_port) as job:
        job.wait_for_metrics()
        warmup = simulate(spool, "--scenario", "steady", "--cluster", warmup_cluster, "--duration", "3",
                          "--speed", "20")  # fmt: skip
        subprocess.run(warmup, check=True, timeout=120, capture_output=True)
        wait_first_batch(job, 300)
        yield prom, job, spool


def dropped_followers(truth: Path, cluster: str) -> set[tuple[str, ...]]:
    """(cluster, topic, partition, broker_id, leader_id) of every follower a
    simulated leader removed from the ISR."""
    out: set[tuple[str, ...]] = set()
    for line in truth.read_text().splitlines():
        c = json.loads(line)
        if c["change"] == "shrink":
            for broker in c["brokers"]:
                out.add((cluster, c["topic"], str(c["partition"]), str(broker), str(c["leader_before"])))
    return out


def test_panels_answer_and_rule_alerts_fire_for_the_stuck_follower_only(tmp_path: Path) -> None:
    cluster = f"e2e-prom-{uuid.uuid4().hex[:8]}"
    queries = panel_queries()
    variables = variable_queries()
    unanswered = {f"{q.dashboard} / {q.panel} / {q.ref_id}: {q.expr}": q.expr for q in queries}
    unanswered |= {f"variable {uid} / {name}: {selector}": selector for uid, name, selector in variables}
    seen: set[tuple[str, ...]] = set()  # replica alerts ever firing
    others: list[dict] = []  # firing alerts that are not replica alerts
    bad_labels: list[dict] = []
    resolved_after_fault = False
    truth = tmp_path / "truth.jsonl"
    with job_on_spool(tmp_path, f"{cluster}-warmup") as (prom, job, spool):
        scenario = simulate(spool, "--scenario", "stuck-follower", "--cluster", cluster, "--duration", str(SIM_S),
                            "--lag-time-max-ms", "10000", "--truth-file", str(truth))  # fmt: skip
        with (tmp_path / "simulate.log").open("wb") as log:
            sim = subprocess.Popen(scenario, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + SIM_S + RUN_SLACK_S
            while time.monotonic() < deadline:
                assert job.running(), job.log_tail()
                for key, expr in list(unanswered.items()):
                    if query(prom, expr):
                        del unanswered[key]
                now = set()
                for a in firing_alerts(prom):
                    labels = a["labels"]
                    if labels["alertname"] == FLAPPING:
                        continue  # fires once the follower is back, by design (docs/alerts.md, "Flapping")
                    if "broker_id" not in labels:
                        others.append(labels)
                        continue
                    if set(labels) != CONTRACT_LABELS:
                        bad_labels.append(labels)
                    now.add(tuple(labels[k] for k in ("alertname", *REPLICA_LABELS)))
                seen |= now
                if {a for a, *_ in seen} >= set(LAG_ALERTS) and not now:
                    resolved_after_fault = True  # the follower caught up and rejoined
                if resolved_after_fault and not unanswered:
                    break
                time.sleep(1)
            metrics_text = requests.get(job.metrics_url, timeout=10).text
        finally:
            sim.terminate()
            sim.wait(timeout=30)

    dropped = dropped_followers(truth, cluster)
    assert {r[1:] for r in dropped} == set(FAULTY), dropped  # the scenario's stuck follower, per the truth
    expected = {(name, *replica) for name in LAG_ALERTS for replica in dropped}
    assert not unanswered, "queries without data:\n" + "\n".join(unanswered)
    assert seen == expected, f"missing {expected - seen}, unexpected {seen - expected}"
    assert not bad_labels, bad_labels
    assert resolved_after_fault, "the replica alerts did not resolve after the follower resumed"
    # No partition alert: the stuck follower alone never takes a partition below min.insync.replicas.
    assert not [o for o in others if o["alertname"] == "KafkaPartitionMinIsrAtRisk"], others
    # The job served the new gauges the rules and the drill-down read.
    assert "isrwatch_replica_in_isr{" in metrics_text
    assert "isrwatch_replica_lag_time_max_seconds{" in metrics_text
