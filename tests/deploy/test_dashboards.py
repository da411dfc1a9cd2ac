"""deploy/grafana: dashboards are valid, every panel has a query, every query
is valid PromQL over the contract metrics and the recording rules, and, against
a real Prometheus scraping the real exporter, every query returns data and the
rule-based alerts fire for the faulty replica only."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from exporter.server import serve
from exporter.store import StatusStore
from isrwatch.status import ReplicaStatus, State
from localservices import Service, binary, prometheus
from tests.deploy.panels import (
    CONTRACT_METRICS,
    DASHBOARDS,
    DEPLOY,
    PIPELINE_METRICS,
    RULES_FILE,
    load_dashboards,
    metric_names,
    panel_queries,
    rules_with_interval,
    variable_queries,
)
from tests.exporter.samples import replica

PROVISIONING = DEPLOY / "grafana" / "provisioning"
REPO_ROOT = DEPLOY.parent
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s"}
_VAR_NAMES = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def _panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p.get("type") != "row"]


def test_dashboards_are_valid_and_distinct() -> None:
    boards = load_dashboards()
    assert set(boards) == {"fleet-overview.json", "replica-drill-down.json", "pipeline-health.json"}
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)
    for name, board in boards.items():
        assert board["title"].startswith("isrwatch / "), name
        assert "isrwatch" in board["tags"], name
        ids = [p["id"] for p in board["panels"]]
        assert len(set(ids)) == len(ids), name
        for panel in _panels(board):
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, (name, panel["title"])
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, panel["title"])


def test_every_panel_has_a_query() -> None:
    for name, board in load_dashboards().items():
        for panel in _panels(board):
            exprs = [t.get("expr", "").strip() for t in panel.get("targets", [])]
            assert exprs and all(exprs), f"{name}: panel {panel.get('title')!r} has no query"
            refs = [t["refId"] for t in panel["targets"]]
            assert len(set(refs)) == len(refs), (name, panel["title"])


@pytest.mark.parametrize(
    ("file", "variables"),
    [
        ("fleet-overview.json", {"datasource", "cluster", "topic", "broker"}),
        ("replica-drill-down.json", {"datasource", "cluster", "topic", "partition", "broker"}),
        ("pipeline-health.json", {"datasource", "cluster"}),
    ],
)
def test_template_variables(file: str, variables: set[str]) -> None:
    board = load_dashboards()[file]
    defined = {v["name"] for v in board["templating"]["list"]}
    assert defined == variables
    used: set[str] = set()
    for panel in _panels(board):
        for target in panel["targets"]:
            used |= {a or b or c for a, b, c in _VAR_NAMES.findall(target["expr"])}
    assert used - BUILTIN_VARS <= defined, f"undefined variables {used - BUILTIN_VARS - defined}"
    # Every filter variable is used by some query (a variable that filters nothing misleads).
    assert defined - {"datasource"} <= used


@pytest.mark.parametrize(
    ("uid", "titles"),
    [
        ("isrwatch-fleet", ["replicas by state", "top 10 replicas by lag ratio", "partitions at min isr risk"]),
        (
            "isrwatch-replica",
            ["time since caught up vs replica.lag.time.max.ms", "time to shrink", "offset lag", "isr changes"],
        ),
        ("isrwatch-pipeline", ["telemetry age", "micro-batch duration", "input rate", "dead letters"]),
    ],
)
def test_required_panels(uid: str, titles: list[str]) -> None:
    present = {q.panel.lower() for q in panel_queries() if q.dashboard == uid}
    assert set(titles) <= present


def test_queries_read_only_known_metrics() -> None:
    recorded = {
        r["record"]: r["expr"]
        for g in yaml.safe_load(RULES_FILE.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    known = CONTRACT_METRICS | PIPELINE_METRICS | set(recorded) | {"up"}
    read: set[str] = set()
    for q in panel_queries():
        names = metric_names(q.expr)
        assert names, f"{q.dashboard} / {q.panel} / {q.ref_id}: no metric in {q.expr!r}"
        assert names <= known, f"{q.dashboard} / {q.panel} / {q.ref_id}: unknown metrics {names - known}"
        read |= names
    for _, _, selector in variable_queries():
        assert metric_names(selector) <= known
    # Follow recording rules down to the raw metrics; every contract metric shows somewhere.
    expanded = set(read)
    for name in read & set(recorded):
        expanded |= metric_names(recorded[name])
        for inner in metric_names(recorded[name]) & set(recorded):
            expanded |= metric_names(recorded[inner])
    assert expanded >= (CONTRACT_METRICS | PIPELINE_METRICS), (CONTRACT_METRICS | PIPELINE_METRICS) - expanded


@pytest.mark.skipif(binary("promtool") is None, reason="promtool not installed (`make system-packages`)")
def test_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses and type-checks each query as a recording rule."""
    rules = [{"record": f"panel:query:{i}", "expr": q.expr} for i, q in enumerate(panel_queries())]
    rules += [{"record": f"panel:variable:{i}", "expr": s} for i, (_, _, s) in enumerate(variable_queries())]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run([binary("promtool") or "", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_substitution_replaces_every_variable() -> None:
    for q in panel_queries({"cluster": "c1"}):
        assert "$" not in q.expr and "[[" not in q.expr, q.expr
    fleet = [q for q in panel_queries({"cluster": "c1", "broker": "2"}) if q.dashboard == "isrwatch-fleet"]
    assert any('cluster=~"c1"' in q.expr and 'broker_id=~"2"' in q.expr for q in fleet)


def test_provisioning() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "isrwatch.yml").read_text())["datasources"]
    assert [d["type"] for d in datasources] == ["prometheus"]
    assert datasources[0]["url"] == "http://prometheus:9090"
    assert datasources[0]["isDefault"] is True
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "isrwatch.yml").read_text())["providers"]
    path = providers[0]["options"]["path"]
    # docker-compose.yml mounts the dashboards exactly where the provider looks.
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./{DASHBOARDS.relative_to(REPO_ROOT)}:{path}:ro" in mounts


# --- against a real Prometheus scraping the real exporter --------------------------------


def _status(partition: int, broker_id: int, leader_id: int, state: State, ratio: float, now_ms: int) -> ReplicaStatus:
    out = state is State.OUT_OF_SYNC
    return replica(
        broker_id,
        state,
        cluster="c1",
        partition=partition,
        leader_id=leader_id,
        eval_ms=now_ms,
        ratio=ratio,
        offset_lag=int(ratio * 1000),
        in_isr=not out,
        isr_size=2 if out else 3,
        lag_time_max_ms=10_000,
    )


@dataclass
class Stack:
    prom: Service
    store: StatusStore


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if binary("prometheus") is None:
        pytest.skip("prometheus not installed (`make system-packages`)")
    workdir = tmp_path_factory.mktemp("prometheus")
    now_ms = int(time.time() * 1000)
    store = StatusStore()
    # orders-0: leader 1; follower 2 out of sync (the faulty one), follower 3 fine.
    # orders-1: leader 2; followers 1 and 3 fine.
    store.update(
        [
            _status(0, 2, 1, State.OUT_OF_SYNC, 1.3, now_ms),
            _status(0, 3, 1, State.OK, 0.1, now_ms),
            _status(1, 1, 2, State.OK, 0.2, now_ms),
            _status(1, 3, 2, State.OK, 0.0, now_ms),
        ]
    )
    store.add_isr_changes("c1", "orders", 0, "shrink")
    store.health.record_batch(0.8, 1200, {"schema": 1})
    server = serve(store, "127.0.0.1", 0)
    try:
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
        config["alerting"] = {"alertmanagers": []}
        config["scrape_configs"] = [
            {"job_name": "isrwatch-exporter", "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}]}
        ]
        (workdir / "rules").mkdir()
        (workdir / "rules" / RULES_FILE.name).write_text(rules_with_interval("1s"))
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        with prometheus(workdir / "prometheus.yml", workdir) as prom:
            yield Stack(prom, store)
    finally:
        server.close()


def _query(prom: Service, expr: str) -> list[dict]:
    body = requests.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _keep_fresh(stack: Stack) -> None:
    """Counters move and telemetry stays current, like a running job."""
    stack.store.set_telemetry_time("c1", int(time.time() * 1000))
    stack.store.health.record_batch(0.7, 900, {"schema": 1})
    stack.store.add_isr_changes("c1", "orders", 0, "expand")


@pytest.mark.services
def test_every_panel_query_returns_data(stack: Stack) -> None:
    queries = panel_queries()
    empty: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _keep_fresh(stack)
        empty = [f"{q.dashboard} / {q.panel} / {q.ref_id}: {q.expr}" for q in queries if not _query(stack.prom, q.expr)]
        if not empty:
            break
        time.sleep(1)
    assert not empty, "\n".join(empty)
    for uid, name, selector in variable_queries():
        assert _query(stack.prom, selector), (uid, name, selector)
    # Filters by a variable value narrow the result to that value.
    lag = [q for q in panel_queries({"broker": "3"}) if q.panel == "Lag ratio"][0]
    assert {r["metric"]["broker_id"] for r in _query(stack.prom, lag.expr)} == {"3"}


@pytest.mark.services
def test_rule_alerts_fire_for_the_faulty_replica_only(stack: Stack) -> None:
    expected = {
        (name, "c1", "orders", "0", "2", "1")
        for name in ("KafkaReplicaNearingIsrShrink", "KafkaReplicaIsrShrinkImminent", "KafkaReplicaOutOfSync")
    }
    firing: set[tuple[str, ...]] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _keep_fresh(stack)
        alerts = requests.get(f"{stack.prom.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        firing = {
            tuple(
                a["labels"].get(k, "") for k in ("alertname", "cluster", "topic", "partition", "broker_id", "leader_id")
            )
            for a in alerts
            if a["state"] == "firing"
        }
        if firing >= expected:
            break
        time.sleep(1)
    assert firing == expected
    # Exactly the contract labels, no job/instance.
    for a in requests.get(f"{stack.prom.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]:
        assert set(a["labels"]) == {"alertname", "severity", "cluster", "topic", "partition", "broker_id", "leader_id"}


_GROUPING = re.compile(r"\b(by|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_BROKER_MATCHER = re.compile(r"\{[^}]*\bbroker_id\s*=~?[^}]*\}")


def test_a_broker_is_keyed_by_its_cluster_in_every_query_and_rule() -> None:
    """Issue 52: every cluster numbers its brokers its own way, so a query that groups or joins
    by broker_id or leader_id groups by cluster too, and a dashboard selecting a broker selects
    its cluster with it."""
    rules = [r["expr"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "expr" in r]
    queries = [(f"{q.dashboard} / {q.panel}", q.raw) for q in panel_queries()] + [("rules", e) for e in rules]
    grouped = 0
    for where, expr in queries:
        for kind, labels in _GROUPING.findall(expr):
            names = {n.strip() for n in labels.split(",")}
            if names & {"broker_id", "leader_id"} and kind in ("by", "on"):
                grouped += 1
                assert "cluster" in names, f"{where}: {kind} ({labels}) without cluster in {expr!r}"
        for selector in _BROKER_MATCHER.findall(expr):
            assert "cluster" in selector, f"{where}: a broker selected without its cluster: {selector}"
    assert grouped > 10  # (the check read the queries it is about)
