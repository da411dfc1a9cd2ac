"""Print the validation table from the e2e tests' result files.

Each test of ``tests/e2e`` writes ``<test>.json`` to ``$ISRWATCH_VALIDATION_OUT``
(default ``<tmp>/isrwatch-validation``). This prints, as Markdown:

* one row per predicted replica (paused and slow followers): when the job's lag
  crossed lag/2 (the prediction), when its ``KafkaReplicaNearingIsrShrink``
  reached stdout, when the leader logged the shrink, and the lead times;
* one row per scenario with its outcome (alerts, shrinks, dead letters).

Usage: ``python tools/validation_table.py [RESULTS_DIR]``
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["load", "lead_table", "scenario_table", "main"]

RESULTS_ENV = "ISRWATCH_VALIDATION_OUT"


def default_dir() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or Path(tempfile.gettempdir()) / "isrwatch-validation")


def load(directory: Path) -> list[dict[str, Any]]:
    """Every result file in ``directory``, by test name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def _s(value: float | None, since: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{value - since:.1f}" if since is not None else f"{value:.1f}"


def lead_table(results: list[dict[str, Any]]) -> list[str]:
    out = [
        "| scenario | lag (s) | replica | crossing lag/2 (s) | alert printed (s) | real shrink (s) "
        "| lead of prediction (s) | lead of alert (s) | floor lag/2 − interval (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lag = r.get("lag_time_max_ms", 0) / 1000
        floor = lag / 2 - r.get("collector_interval_s", 0)
        for row in r.get("rows", []):
            t0 = row["fault_at"]
            out.append(
                f"| {row['scenario']} | {lag:g} | {row['topic']}-{row['partition']} broker {row['broker_id']} "
                f"| {_s(row.get('predicted_crossing_at'), t0)} | {_s(row.get('alert_arrived'), t0)} "
                f"| {_s(row.get('shrink_at'), t0)} | {_s(row.get('lead_s'))} | {_s(row.get('arrival_lead_s'))} "
                f"| {floor:g} |"
            )
    return out


def _name_status(alert: list[Any]) -> tuple[str, str]:
    """(name, status) of a recorded alert: ``[arrived, name, status, ...]``, or the restart
    test's ``[arrived, run, Alertmanager body]``."""
    if isinstance(alert[2], dict):
        return alert[2]["labels"]["alertname"], alert[2]["status"]
    return alert[1], alert[2]


def scenario_table(results: list[dict[str, Any]]) -> list[str]:
    out = ["| test | scenario | alerts (name: firing/resolved) | real shrinks | notes |", "|---|---|---|---|---|"]
    for r in results:
        counts: Counter = Counter(_name_status(a) for a in r.get("alerts", []))
        names = sorted({n for n, _ in counts})
        alerts = ", ".join(f"{n}: {counts[(n, 'firing')]}/{counts[(n, 'resolved')]}" for n in names) or "none"
        shrinks = r.get("shrinks", sum(1 for row in r.get("rows", []) if row.get("shrink_at")))
        if isinstance(shrinks, list):  # (the late-job test records the shrinks themselves)
            shrinks = len(shrinks)
        notes = []
        if "burst_s" in r:
            notes.append(f"burst produced in {r['burst_s']:.1f} s")
        if "deadletters" in r:
            notes.append("dead letters: " + ", ".join(sorted(map(str, r["deadletters"]))))
        if "observations_expected" in r:
            note = f"observations on the topic {r['observations_expected']}, aggregated {r['observations_aggregated']}"
            if "first_run_events" in r:
                note += f"; events run 1/run 2: {r['first_run_events']}/{r['second_run_events']}"
            notes.append(note)
        out.append(f"| {r['test']} | {r.get('scenario', '')} | {alerts} | {shrinks} | {'; '.join(notes)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else default_dir()
    results = load(directory)
    if not results:
        print(f"no result files in {directory}: run `pytest tests/e2e` first", file=sys.stderr)
        return 1
    print("Lead times (seconds after the fault; lead = real shrink − prediction / − alert printed):\n")
    print("\n".join(lead_table(results)))
    print("\nScenarios:\n")
    print("\n".join(scenario_table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
