"""Alert latency: telemetry that crosses a threshold is published -> a real
Alertmanager holds the alert. The job's own path beside the rule-based path.

Everything is real and on loopback: a local Kafka (``localkafka``), the job
(``streaming.lifecycle.job.run``, Kafka mode, 1 s trigger, ``--alertmanager-url``), the
exporter (``exporter.main.Exporter``) on the job's state topic, Prometheus
scraping it and evaluating the shipped rules (``deploy/prometheus/rules``) at
the shipped 5 s intervals, and one Alertmanager receiving both. Prometheus
adds the label ``path="rules"`` to its alerts (``alert_relabel_configs``) so
the two paths stay apart in Alertmanager.

A fleet (``bench.load.Fleet``) is published once a second at the wall clock,
like a collector polling every second. Every few seconds one more replica
turns slow (fetching at half its leader's pace: progressing, not stalled).
The bench computes from the values it sends, with ``isrwatch.rule``, the
round whose observation first has a lag ratio >= 0.5 (the
``KafkaReplicaNearingIsrShrink`` threshold); the latency is from the moment
that round is acknowledged by Kafka to the first poll (every 50 ms) of
Alertmanager's API that shows the alert. The replica then recovers.

``python -m bench.latency --crossings 60``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench import kafka as bkafka
from bench.load import Fleet
from bench.machine import print_header

__all__ = ["Episode", "run", "percentile", "main"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules"
ALERT = "KafkaReplicaNearingIsrShrink"
NEARING_RATIO = 0.5
LAG_TIME_MAX_MS = 10_000


@dataclass
class Episode:
    replica: int
    since_round: int
    crossing_round: int = -1
    published: float | None = None  # perf_counter when the crossing round was acknowledged
    seen: dict[str, float] = field(default_factory=dict)  # path -> perf_counter first seen


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def _crossing_round(fleet: Fleet, i: int, since: int) -> int:
    """The first round whose observation shows lag ratio >= NEARING_RATIO (the job's rule, from the sent values)."""
    from isrwatch.rule import Rule, caught_up_time

    lcu: int | None = None
    slow = {i: since}
    for r in range(max(0, since - 2), since + 100):
        leo, lleo, _pl, pll = fleet.values(i, r, slow)
        t = r * fleet.interval_ms
        cu = caught_up_time(Rule.KIP16_REFINED, t, leo, lleo, t - fleet.interval_ms if r else None, pll)
        if cu is not None and (lcu is None or cu > lcu):
            lcu = cu
        if lcu is not None and r >= since and (t - lcu) / LAG_TIME_MAX_MS >= NEARING_RATIO:
            return r
    raise RuntimeError("no crossing within 100 rounds")


def _prometheus_config(workdir: Path, exporter_port: int, am_url: str, interval_s: int) -> Path:
    rules = workdir / "rules"
    rules.mkdir()
    for f in RULES.glob("*.yml"):
        (rules / f.name).write_text(f.read_text())
    am = am_url.removeprefix("http://")
    cfg = workdir / "prometheus.yml"
    cfg.write_text(
        f"""global:
  scrape_interval: {interval_s}s
  evaluation_interval: {interval_s}s
rule_files:
  - rules/*.yml
alerting:
  alert_relabel_configs:
    - target_label: path
      replacement: rules
  alertmanagers:
    - static_configs:
        - targets: ["{am}"]
scrape_configs:
  - job_name: isrwatch-exporter
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
"""
    )
    return cfg


def _alertmanager_config(workdir: Path) -> Path:
    cfg = workdir / "alertmanager.yml"
    cfg.write_text("route:\n  receiver: hold\n  group_wait: 1s\nreceivers:\n  - name: hold\n")
    return cfg


class _Poller(threading.Thread):
    """Polls Alertmanager's API; records when each replica's alert first shows, per path."""

    def __init__(self, url: str, fleet: Fleet, episodes: dict[int, Episode], lock: threading.Lock) -> None:
        super().__init__(name="bench-am-poller", daemon=True)
        self.url = url + "/api/v2/alerts"
        self.index = {k: i for i, k in enumerate(fleet.keys)}
        self.episodes = episodes
        self.lock = lock
        self.stop = threading.Event()
        self.polls = 0

    def run(self) -> None:
        with requests.Session() as http:
            while not self.stop.is_set():
                t_req = time.perf_counter()
                with contextlib.suppress(requests.RequestException):
                    alerts = http.get(self.url, params={"filter": f'alertname="{ALERT}"'}, timeout=5).json()
                    now = time.perf_counter()
                    self.polls += 1
                    with self.lock:
                        for a in alerts:
                            lb = a.get("labels", {})
                            key = (lb.get("topic"), int(lb.get("partition", -1)), int(lb.get("broker_id", -1)))
                            i = self.index.get(key)
                            ep = self.episodes.get(i) if i is not None else None
                            if ep is None:
                                continue
                            path = "rules" if lb.get("path") == "rules" else "job"
                            ep.seen.setdefault(path, now)
                self.stop.wait(max(0.0, 0.05 - (time.perf_counter() - t_req)))


def run(
    crossings: int = 60,
    replicas: int = 2000,
    every_s: float = 2.0,
    max_hold_s: float = 60.0,
    warmup_s: float = 25.0,
    prometheus_interval_s: int = 5,
    spark: Any | None = None,
    kafka: Any | None = None,
) -> dict[str, Any]:
    """``crossings`` episodes, one every ``every_s`` after ``warmup_s``, in a fleet of
    ``replicas`` published every second; each path's latencies and the job's batches.
    ``spark`` and ``kafka``: a session and a local cluster to use and leave running (by
    default the benchmark starts its own and stops them)."""
    from exporter.main import Exporter
    from exporter.settings import ExporterSettings
    from localkafka import COMPAT_CONFIG
    from localservices import alertmanager, prometheus
    from streaming.lifecycle import job
    from streaming.lifecycle.query import JOB_QUERY
    from streaming.lifecycle.session import build_session

    fleet = Fleet(replicas)
    work = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    (work / "am").mkdir()
    (work / "prom").mkdir()
    episodes: dict[int, Episode] = {}
    done: list[Episode] = []
    lock = threading.Lock()
    own_spark, own_kafka = spark is None, kafka is None
    if spark is None:
        spark = build_session("local[2]", 2, app_name="isrwatch-bench-latency")
    if kafka is None:
        kafka = bkafka.start_cluster()
    stop = threading.Event()
    job_thread: threading.Thread | None = None
    errors: list[BaseException] = []
    from bench.baselines import progress_of
    from bench.throughput import BatchLog

    batch_log = BatchLog().__enter__()
    trigger_ms: list[float] = []
    try:
        topic = bkafka.new_topic(kafka, "bench-latency", partitions=1)
        with alertmanager(_alertmanager_config(work / "am"), work / "am") as am:
            from bench.throughput import job_settings
            from streaming.settings import AlertingSettings

            settings = job_settings(kafka, topic, str(work / "ckpt"), 100_000, 1.0, stale_after_seconds=60.0)
            alerting = AlertingSettings(alertmanager_url=[am.url])

            def target() -> None:
                try:
                    job.run(settings, alerting=alerting, spark=spark, stop_event=stop)
                except BaseException as e:
                    errors.append(e)

            job_thread = threading.Thread(target=target, name="bench-job", daemon=True)
            job_thread.start()
            exporter = Exporter(
                ExporterSettings(
                    bootstrap_servers=kafka.bootstrap_servers,
                    kafka_config=[f"{k}={v}" for k, v in COMPAT_CONFIG.items()],
                    state_topic=settings.state_topic,
                    host="127.0.0.1",
                    port=0,
                )
            )
            prod = bkafka.producer(kafka, **{"linger.ms": 0})
            r = 0
            start_ms = (int(time.time() * 1000) // 1000 + 1) * 1000
            exporter_started = False
            with contextlib.ExitStack() as stack:
                poller = _Poller(am.url, fleet, episodes, lock)
                poller.start()
                stack.callback(poller.stop.set)
                wall0 = time.time()
                next_crossing = wall0 + warmup_s
                started = 0
                next_replica = 0
                while True:
                    if errors:
                        raise RuntimeError(f"job failed: {errors[0]}") from errors[0]
                    t_ms = start_ms + r * fleet.interval_ms
                    delay = t_ms / 1000 - time.time()
                    if delay > 0:
                        time.sleep(delay)
                    now = time.time()
                    with lock:
                        if started < crossings and now >= next_crossing:
                            ep = Episode(next_replica, r + 1)
                            ep.crossing_round = _crossing_round(fleet, ep.replica, ep.since_round)
                            episodes[ep.replica] = ep
                            next_replica += 7  # spread over topics and brokers
                            started += 1
                            next_crossing += every_s
                        for i, ep in list(episodes.items()):
                            # recover once both paths showed the alert (or after max_hold_s)
                            if (len(ep.seen) == 2 and r > ep.crossing_round + 2) or r > ep.crossing_round + max_hold_s:
                                done.append(episodes.pop(i))
                        slow = {i: ep.since_round for i, ep in episodes.items()}
                    for rec in fleet.round(r, t_ms, slow):
                        prod.produce(topic, rec, b"bench")
                    prod.flush(10)
                    acked = time.perf_counter()
                    with lock:
                        for ep in episodes.values():
                            if ep.crossing_round == r:
                                ep.published = acked
                    if not exporter_started and r >= 2:
                        exporter.start()
                        stack.callback(exporter.close)
                        prom = stack.enter_context(
                            prometheus(
                                _prometheus_config(work / "prom", exporter.server.port, am.url, prometheus_interval_s),
                                work / "prom",
                            )
                        )
                        exporter_started = True
                    r += 1
                    if started >= crossings and not episodes:
                        break
                    if r % 30 == 0:
                        print(
                            f"  round={r} crossings_started={started} finished={len(done)} am_polls={poller.polls}",
                            flush=True,
                        )
                del prom
                for q in spark.streams.active:
                    if q.name == JOB_QUERY:
                        trigger_ms = [p["durationMs"]["triggerExecution"] for p in progress_of(q)]
    finally:
        batch_log.__exit__()
        stop.set()
        if job_thread is not None:
            job_thread.join(timeout=120)
        if own_kafka:
            kafka.close()
        if own_spark:
            spark.stop()
    lat: dict[str, list[float]] = {"job": [], "rules": []}
    missed = {"job": 0, "rules": 0}
    for ep in done:
        for path in lat:
            if ep.published is not None and path in ep.seen:
                lat[path].append(ep.seen[path] - ep.published)
            else:
                missed[path] += 1
    out: dict[str, Any] = {"crossings": len(done), "trigger_s": 1.0, "prometheus_interval_s": prometheus_interval_s}
    for path, xs in lat.items():
        out[path] = {
            "n": len(xs),
            "missed": missed[path],
            "p50_s": round(percentile(xs, 50), 3),
            "p99_s": round(percentile(xs, 99), 3),
            "max_s": round(max(xs), 3) if xs else float("nan"),
            "min_s": round(min(xs), 3) if xs else float("nan"),
            "mean_s": round(statistics.fmean(xs), 3) if xs else float("nan"),
            "values": [round(x, 3) for x in xs],
        }
    batch_ms = [float(f.get("batch_ms", 0)) for _, f in batch_log.batches[5:]]
    lag_s = [float(f.get("telemetry_lag_s", 0)) for _, f in batch_log.batches[5:]]
    out["job_batches"] = {
        "n": len(batch_ms),
        "driver_ms_p50": percentile(batch_ms, 50),
        "driver_ms_max": max(batch_ms, default=0),
        "telemetry_lag_s_p50": percentile(lag_s, 50),
        "telemetry_lag_s_max": max(lag_s, default=0),
        "trigger_ms_p50": percentile(trigger_ms, 50),
        "trigger_ms_max": max(trigger_ms, default=0),
    }
    if out["job"]["n"] and out["rules"]["n"]:
        out["p50_ratio"] = round(out["rules"]["p50_s"] / out["job"]["p50_s"], 1)
        out["p99_ratio"] = round(out["rules"]["p99_s"] / out["job"]["p99_s"], 1)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    ap.add_argument("--crossings", type=int, default=60)
    ap.add_argument("--replicas", type=int, default=2000, help="fleet published every second")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between new crossings")
    ap.add_argument("--prometheus-interval", type=int, default=5, help="scrape and evaluation interval (shipped: 5)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    print_header("isrwatch alert latency: job -> Alertmanager vs Prometheus rules -> Alertmanager")
    out = run(args.crossings, args.replicas, args.every, prometheus_interval_s=args.prometheus_interval)
    for path in ("job", "rules"):
        o = out[path]
        print(
            f"{path}: crossings={o['n']} missed={o['missed']} p50_s={o['p50_s']} p99_s={o['p99_s']} "
            f"max_s={o['max_s']} min_s={o['min_s']}"
        )
    print(f"job batches (after the first 5): {out['job_batches']}")
    print(f"rule-based / job: p50 {out.get('p50_ratio')}x, p99 {out.get('p99_ratio')}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
