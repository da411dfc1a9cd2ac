"""The real run behind the README's pictures, and what they show.

The dashboards' panels to draw (``PANELS``, read from deploy/grafana/dashboards/*.json
with their variables filled in), and ``record()``: the streaming job (Spark local mode,
in this process) on the embedded ``stuck-follower`` scenario, scraped by a real
Prometheus (Debian package, loopback) evaluating the shipped rules, whose range
queries of those panels are returned with the job's alert events and the simulator's
truth. ``tools/draw_dashboards.py`` draws them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from isrwatch.logs import kv  # noqa: E402
from localkafka import free_port  # noqa: E402
from localservices import binary, prometheus  # noqa: E402

__all__ = ["FAULT", "PANELS", "REPLICA", "legend", "panel_targets", "record"]

log = logging.getLogger("draw_dashboards")

DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
PROM_DIR = REPO / "deploy" / "prometheus"
CLUSTER = "sim"
SCENARIO = "stuck-follower"
SIM_S = 70
LAG_MS = 10_000
# The drill-down shows the stuck follower of orders-0 (broker 3, leader 1).
REPLICA = {"cluster": CLUSTER, "topic": "orders", "partition": "0", "broker": "3"}
FAULT = (10, 45)  # the scenario's fetcher stop and resume, seconds from its start

# (file, panel title, variable values)
PANELS = {
    "fleet_states": ("fleet-overview.json", "Replicas by state", {"cluster": CLUSTER}),
    "fleet_top": ("fleet-overview.json", "Top 10 replicas by lag ratio", {"cluster": CLUSTER}),
    "replica_since": ("replica-drill-down.json", "Time since caught up vs replica.lag.time.max.ms", REPLICA),
    "replica_shrink": ("replica-drill-down.json", "Time to shrink", REPLICA),
    "replica_ratio": ("replica-drill-down.json", "Lag ratio", REPLICA),
}
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "1s"}
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


# --- the dashboards' queries -------------------------------------------------------------


def panel_targets(file: str, title: str, values: dict[str, str]) -> list[dict[str, Any]]:
    """The panel's targets: refId, expr (variables substituted), legendFormat."""
    board = json.loads((DASHBOARDS / file).read_text())
    for panel in board["panels"]:
        if panel.get("title") == title:
            out: list[dict[str, Any]] = []
            for t in panel["targets"]:

                def repl(m: re.Match[str]) -> str:
                    name = m.group(1) or m.group(2) or m.group(3)
                    return values.get(name) or GRAFANA_BUILTINS.get(name, ".*")

                out.append({"ref": t["refId"], "expr": _VAR.sub(repl, t["expr"]), "legend": t.get("legendFormat", "")})
            return out
    raise SystemExit(f"{file}: no panel titled {title!r}")


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or str(labels)


# --- a real run --------------------------------------------------------------------------


@contextlib.contextmanager
def _prometheus(workdir: Path, job_port: int) -> Iterator[str]:
    """The shipped prometheus.yml and rules, scraping the job every second (rules too)."""
    if binary("prometheus") is None:
        raise SystemExit("prometheus is not installed (Debian package prometheus)")
    workdir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    config["alerting"] = {"alertmanagers": []}
    config["scrape_configs"] = [
        {"job_name": "isrwatch-job", "static_configs": [{"targets": [f"127.0.0.1:{job_port}"]}]}
    ]
    (workdir / "rules").mkdir()
    for rules in (PROM_DIR / "rules").glob("*.yml"):
        data = yaml.safe_load(rules.read_text())
        for group in data["groups"]:
            group["interval"] = "1s"
        (workdir / "rules" / rules.name).write_text(yaml.safe_dump(data, sort_keys=False))
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    with prometheus(workdir / "prometheus.yml", workdir) as service:
        yield service.url


def _query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    r = requests.get(
        f"{prom}/api/v1/query_range",
        params={"query": expr, "start": str(start), "end": str(end), "step": "1s"},
        timeout=30,
    )
    body = r.json()
    if body.get("status") != "success":
        raise SystemExit(f"query failed: {expr}: {body}")
    return [
        {"labels": s["metric"], "t": [float(t) for t, _ in s["values"]], "v": [float(v) for _, v in s["values"]]}
        for s in body["data"]["result"]
    ]


def record() -> dict[str, Any]:
    """Run the scenario through the job with Prometheus scraping it; return
    every drawn panel's series, the job's alert events and the true ISR changes."""
    from simulator.run import feed_spool, now_ms
    from streaming.driver.notify import StdoutSink
    from streaming.lifecycle.job import JobHandles, run
    from streaming.settings import JobSettings

    work = Path(tempfile.mkdtemp(prefix="isrwatch-draw-"))
    try:
        job_port = free_port()
        spool = work / "spool"
        spool.mkdir()
        (work / "prometheus").mkdir()
        with _prometheus(work / "prometheus", job_port) as prom:
            settings = JobSettings(
                spool_dir=str(spool),
                checkpoint_dir=str(work / "checkpoint"),
                metrics_port=job_port,
                lag_time_max_ms=LAG_MS,
                stale_after_seconds=3600,  # the warm-up cluster stops early
            )
            alerts = io.StringIO()
            handles = JobHandles()
            stop = threading.Event()
            failure: list[BaseException] = []

            def job() -> None:
                try:
                    run(settings, handles=handles, stop_event=stop, sinks=[StdoutSink(stream=alerts)])
                except BaseException as e:
                    failure.append(e)

            thread = threading.Thread(target=job, name="job", daemon=True)
            thread.start()
            try:
                if not handles.ready.wait(300):
                    raise SystemExit(f"the job did not start: {failure}")
                # Warm Spark up on a throw-away cluster, so the scenario is seen from its start.
                feed_spool(spool, "steady", 20.0, cluster="warmup", duration_s=3)
                deadline = time.monotonic() + 300
                while handles.store.snapshot().batches < 1:
                    if failure or time.monotonic() > deadline:
                        raise SystemExit(f"no micro-batch from the job: {failure}")
                    time.sleep(0.5)
                start_ms = now_ms()
                truth = io.StringIO()
                log.info(kv(event="scenario_start", scenario=SCENARIO, seconds=SIM_S))
                feed_spool(
                    spool,
                    SCENARIO,
                    1.0,
                    cluster=CLUSTER,
                    duration_s=SIM_S,
                    truth_file=truth,
                    start_ms=start_ms,
                    lag_time_max_ms=LAG_MS,
                )
                end_ms = start_ms + SIM_S * 1000
                deadline = time.monotonic() + 120
                while handles.monitor.cluster_now.get(CLUSTER, 0) < end_ms - 1000:
                    if failure or time.monotonic() > deadline:
                        raise SystemExit(f"the job did not catch up: {failure}")
                    time.sleep(0.5)
                time.sleep(3)  # a last scrape and rule evaluation
                series = {}
                for key, (file, title, values) in PANELS.items():
                    targets = panel_targets(file, title, values)
                    for t in targets:
                        t["series"] = _query_range(prom, t["expr"], start_ms / 1000 - 2, end_ms / 1000)
                    series[key] = {"title": title, "targets": targets}
            finally:
                stop.set()
                thread.join(120)
        events = [json.loads(line) for line in alerts.getvalue().splitlines() if line.strip()]
        return {
            "scenario": SCENARIO,
            "start_ms": start_ms,
            "end_ms": end_ms,
            "lag_time_max_ms": LAG_MS,
            "panels": series,
            "alerts": [e for e in events if e["labels"].get("cluster") == CLUSTER],
            "truth": [json.loads(line) for line in truth.getvalue().splitlines() if line.strip()],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
