"""The dashboards' queries, ready to send to a real Prometheus.

``panel_queries()`` lists every panel target of every dashboard under
deploy/grafana/dashboards with the template variables substituted (``.*`` for
the "All" of cluster/topic/partition/broker, fixed windows for Grafana's
``$__rate_interval`` and friends). ``metric_names()`` tells which metric names
an expression reads, so tests can hold the queries to the contract names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = [
    "REPO",
    "DEPLOY",
    "DASHBOARDS",
    "RULES_FILE",
    "RULE_RUNBOOK_URL",
    "FLAPPING",
    "CONTRACT_METRICS",
    "PIPELINE_METRICS",
    "PanelQuery",
    "load_dashboards",
    "panel_queries",
    "variable_queries",
    "substitute",
    "metric_names",
    "recording_rule_names",
    "known_metric_names",
    "rules_with_interval",
]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
RULES_FILE = DEPLOY / "prometheus" / "rules" / "isrwatch-alerts.yml"
# Every alert rule's runbook_url before its "#anchor": the URL of the recording rule isrwatch:runbook_url.
RULE_RUNBOOK_URL = '{{ with query "isrwatch:runbook_url" }}{{ (index . 0).Labels.url }}{{ end }}'
# A rule-only alert (the job does not send it): a follower that left the ISR and came back, read
# from isrwatch_replica_out_of_sync_episodes_total (docs/alerts.md).
FLAPPING = "KafkaReplicaFlapping"

# DESIGN.md "Contracts" (counters as exposed, with _total).
CONTRACT_METRICS = frozenset(
    {
        "isrwatch_replica_time_since_caught_up_seconds",
        "isrwatch_replica_lag_ratio",
        "isrwatch_replica_time_to_shrink_seconds",
        "isrwatch_replica_offset_lag",
        "isrwatch_replica_state",
        "isrwatch_replica_in_isr",
        "isrwatch_replica_lag_time_max_seconds",
        "isrwatch_replica_out_of_sync_episodes_total",
        "isrwatch_partition_isr_size",
        "isrwatch_partition_predicted_isr_size",
        "isrwatch_partition_min_isr_headroom",
        "isrwatch_isr_changes_total",
        "isrwatch_telemetry_last_timestamp_seconds",
        "isrwatch_up",
    }
)
# The streaming job's own metrics, served by its in-process exporter.
PIPELINE_METRICS = frozenset(
    {
        "isrwatch_job_batch_duration_seconds",
        "isrwatch_job_batches_total",
        "isrwatch_job_observations_total",
        "isrwatch_deadletter_records_total",
        # the broker's truth, live (isrwatch.outcomes)
        "isrwatch_isr_shrinks_total",
        "isrwatch_isr_shrink_lead_seconds_bucket",
        "isrwatch_warnings_without_shrink_total",
    }
)
# Read by the shipped rules, not drawn: when a copy of a replica's series was last updated.
RULE_ONLY_METRICS = frozenset({"isrwatch_replica_last_update_timestamp_seconds"})
# Prometheus' own per-target series.
_BUILTIN_METRICS = frozenset({"up"})

# Values of Grafana's built-in variables when a query is sent outside Grafana.
GRAFANA_BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
}


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # dashboard uid
    panel: str  # panel title
    ref_id: str
    raw: str  # as written in the dashboard
    expr: str  # variables substituted
    instant: bool


def load_dashboards(directory: Path = DASHBOARDS) -> dict[str, dict]:
    """Dashboard JSON by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return [p for p in out if p.get("type") != "row"]


_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace ``$name``, ``${name}``, ``${name:fmt}`` and ``[[name]]``: from
    ``values``, then Grafana's built-ins, else ``.*`` (the "All" value).
    Longer names win (``$__rate_interval`` is not ``$__rate`` + text)."""
    values = values or {}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values:
            return values[name]
        return GRAFANA_BUILTINS.get(name, ".*")

    return _VAR.sub(repl, expr)


def panel_queries(values: dict[str, str] | None = None, directory: Path = DASHBOARDS) -> list[PanelQuery]:
    """Every panel target of every dashboard, variables substituted."""
    out = []
    for dashboard in load_dashboards(directory).values():
        for panel in _panels(dashboard):
            for target in panel.get("targets", []):
                raw = target.get("expr", "")
                out.append(
                    PanelQuery(
                        dashboard=dashboard["uid"],
                        panel=panel.get("title", ""),
                        ref_id=target.get("refId", ""),
                        raw=raw,
                        expr=substitute(raw, values),
                        instant=bool(target.get("instant")) and not target.get("range"),
                    )
                )
    return out


_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$|^label_values\((\w+)\)$", re.S)


def variable_queries(values: dict[str, str] | None = None, directory: Path = DASHBOARDS) -> list[tuple[str, str, str]]:
    """``(dashboard uid, variable, series selector)`` of every query variable
    (``label_values(selector, label)``), variables substituted."""
    out = []
    for dashboard in load_dashboards(directory).values():
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = _LABEL_VALUES.match(query.strip())
            if not m:
                raise ValueError(f"{dashboard['uid']}: variable {var['name']}: not label_values(...): {query!r}")
            out.append((dashboard["uid"], var["name"], substitute(m.group(1) or m.group(3), values)))
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (not functions, labels, keywords)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("{}", text)
    text = _BRACKETS.sub("[]", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS or name in ("group_left", "group_right"):
            continue
        names.add(name)
    return names


def recording_rule_names(path: Path = RULES_FILE) -> set[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def known_metric_names() -> set[str]:
    return set(CONTRACT_METRICS | PIPELINE_METRICS | RULE_ONLY_METRICS | _BUILTIN_METRICS) | recording_rule_names()


def rules_with_interval(interval: str, path: Path = RULES_FILE) -> str:
    """The rules file with every group evaluated every ``interval`` (tests run
    them faster than production)."""
    data = yaml.safe_load(path.read_text())
    for group in data["groups"]:
        group["interval"] = interval
    return yaml.safe_dump(data, sort_keys=False)
