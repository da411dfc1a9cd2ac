"""What an operator looks at during the e2e faults: the job's and the exporter's /metrics and a
real Prometheus with the shipped rules (issue 17).

* ``GaugeWatch``: a thread that every 0.5 s notes which followers each of them shows at lag
  ratio >= 0.5 (Prometheus: ``KafkaReplicaNearingIsrShrink`` firing).
* ``prometheus_config``: the shipped prometheus.yml and rules, scraping given targets every second.
* ``prometheus_scraping``: an exporter started for a pipeline and a real Prometheus with the
  shipped rules scraping it and the job.
* ``prometheus_followers``: the followers of a topic a real Prometheus has series of now, and
  those its rules fire an alert for.
* ``prometheus_fired``: every alert the shipped rules fired over the last seconds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
import yaml

from isrwatch.alerts import AlertName
from localservices import prometheus
from tests.deploy.panels import DEPLOY, RULES_FILE, rules_with_interval
from tests.e2e_observability.running_job import parse_metrics

__all__ = ["GaugeWatch", "prometheus_config", "prometheus_fired", "prometheus_followers", "prometheus_scraping"]

NEARING = AlertName.NEARING.value


class GaugeWatch(threading.Thread):
    """Every 0.5 s: which followers of ``topic`` the job's /metrics and the exporter's show at
    lag ratio >= 0.5, and which Prometheus has ``KafkaReplicaNearingIsrShrink`` firing for;
    ``first(kind, partition, broker, after)`` is the first such time after ``after``."""

    def __init__(self, topic: str, job_url: str, exporter_url: str, prom_url: str) -> None:
        super().__init__(name="gauge-watch", daemon=True)
        self.topic = topic
        self.urls = {"job": job_url, "exporter": exporter_url}
        self.prom_url = prom_url
        self.seen: dict[tuple[str, int, int], list[float]] = {}
        self.stop_event = threading.Event()

    def scrape(self, kind: str) -> dict[Any, float]:
        try:
            return parse_metrics(requests.get(self.urls[kind], timeout=2).text)
        except requests.RequestException:
            return {}

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            now = time.time()
            for kind in self.urls:
                for (name, labels), value in self.scrape(kind).items():
                    lab = dict(labels)
                    if name == "isrwatch_replica_lag_ratio" and lab.get("topic") == self.topic and value >= 0.5:
                        self.seen.setdefault((kind, int(lab["partition"]), int(lab["broker_id"])), []).append(now)
            try:
                alerts = requests.get(f"{self.prom_url}/api/v1/alerts", timeout=2).json()["data"]["alerts"]
            except (requests.RequestException, ValueError, KeyError):
                continue
            for a in alerts:
                lab = a["labels"]
                if a["state"] == "firing" and lab.get("alertname") == NEARING and lab.get("topic") == self.topic:
                    self.seen.setdefault(("prometheus", int(lab["partition"]), int(lab["broker_id"])), []).append(now)

    def first(self, kind: str, partition: int, broker: int, after: float) -> float | None:
        return next((t for t in self.seen.get((kind, partition, broker), []) if t >= after), None)

    def states(self, kind: str) -> dict[tuple[int, int], str]:
        """(partition, broker) -> current state of every follower of ``topic``."""
        out = {}
        for (name, labels), value in self.scrape(kind).items():
            lab = dict(labels)
            if name == "isrwatch_replica_state" and lab.get("topic") == self.topic and value == 1:
                out[(int(lab["partition"]), int(lab["broker_id"]))] = lab["state"]
        return out


def exporter_agrees(watch: GaugeWatch, every_replica: bool = True) -> bool:
    """The exporter (the state topic: every replica) shows each follower of ``watch.topic`` in
    the job's state. The job serves every replica (``--driver-replicas all``): the same states.
    With ``not-ok`` it serves only those it holds (docs/metrics.md): each in the exporter's state,
    the exporter serving replicas the job does not."""
    job, exporter = watch.states("job"), watch.states("exporter")
    if every_replica:
        return bool(job) and exporter == job
    return bool(exporter) and job.items() <= exporter.items()


def prometheus_config(workdir: Path, targets: list[str]) -> Path:
    """The shipped prometheus.yml and rules, scraping ``targets`` every second."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    config["alerting"] = {"alertmanagers": []}
    config["scrape_configs"] = [
        {"job_name": f"isrwatch-{i}", "static_configs": [{"targets": [t]}]} for i, t in enumerate(targets)
    ]
    (workdir / "rules").mkdir()
    (workdir / "rules" / RULES_FILE.name).write_text(rules_with_interval("1s"))
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def prometheus_followers(prom_url: str, topic: str, instance: str | None = None) -> dict[str, set[tuple[int, int]]]:
    """(partition, broker) of ``topic``'s followers a Prometheus shows now: ``"series"``, with an
    ``isrwatch_replica_lag_ratio`` series of any target, or of target ``instance`` (host:port)
    only (a series a target stopped exposing is marked stale at its next scrape, and gone from
    the answer), and ``"firing"``, with an alert of the shipped rules firing (of any target:
    the rules aggregate the targets)."""
    where = f'topic="{topic}"' + (f',instance="{instance}"' if instance else "")
    query = {"query": f"isrwatch_replica_lag_ratio{{{where}}}"}
    result = requests.get(f"{prom_url}/api/v1/query", params=query, timeout=5).json()["data"]["result"]
    alerts = requests.get(f"{prom_url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return {
        "series": {(int(r["metric"]["partition"]), int(r["metric"]["broker_id"])) for r in result},
        "firing": {
            (int(a["labels"]["partition"]), int(a["labels"]["broker_id"]))
            for a in alerts
            if a["state"] == "firing" and a["labels"].get("topic") == topic and "broker_id" in a["labels"]
        },
    }


def prometheus_fired(prom_url: str, seconds: float) -> list[tuple[dict[str, str], list[float]]]:
    """Every alert the rules had firing at any evaluation in the last ``seconds`` (Prometheus's
    own ``ALERTS`` series, one per alert and state): (its labels, the evaluation times, epoch
    seconds, at which it was firing)."""
    query = {"query": f'ALERTS{{alertstate="firing"}}[{max(1, round(seconds))}s]'}
    result = requests.get(f"{prom_url}/api/v1/query", params=query, timeout=10).json()["data"]["result"]
    return [(dict(r["metric"]), [float(t) for t, _ in r["values"]]) for r in result]


@contextlib.contextmanager
def prometheus_scraping(pipe: Any, workdir: Path) -> Iterator[Any]:
    """Start an exporter for ``pipe`` (``Pipeline.start_exporter``: the pipeline stops it) and a
    real Prometheus with the shipped rules scraping it and the job's /metrics; the Prometheus
    service (``.url``) while the block runs."""
    pipe.start_exporter()
    prom_dir = workdir / "prometheus"
    prom_dir.mkdir()
    targets = [f"127.0.0.1:{pipe.metrics_port}", f"127.0.0.1:{pipe.exporter_port}"]
    with prometheus(prometheus_config(prom_dir, targets), prom_dir) as prom:
        yield prom
