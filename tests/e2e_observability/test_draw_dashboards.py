"""tools/draw_dashboards.py draws the README's pictures from a recorded real run
(data/stuck-follower-run.json, saved by ``--save-data``: Prometheus range
queries of the dashboards' panels, the job's alert events, the simulator's
truth). The run itself needs Spark and Prometheus; here only the drawing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = Path(__file__).parent / "data" / "stuck-follower-run.json"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("draw_dashboards", REPO / "tools" / "draw_dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_draws_the_three_pictures_small(tool: ModuleType, tmp_path: Path) -> None:
    paths = tool.draw(json.loads(RUN.read_text()), tmp_path)
    assert [p.name for p in paths] == ["dashboard-fleet.png", "dashboard-replica.png", "alert-flow.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert 10_000 < len(data) < 300_000, (p.name, len(data))


def test_the_panels_drawn_are_the_dashboards_queries(tool: ModuleType) -> None:
    run = json.loads(RUN.read_text())
    for key, (file, title, values) in tool.PANELS.items():
        recorded = [t["expr"] for t in run["panels"][key]["targets"]]
        current = [t["expr"] for t in tool.panel_targets(file, title, values)]
        assert recorded == current, (
            f"{key}: the dashboard's query changed; re-record and redraw: python tools/draw_dashboards.py "
            f"--save-data {RUN.relative_to(REPO)}"
        )
        assert all(t["series"] for t in run["panels"][key]["targets"]), key


def test_the_recorded_alerts_warn_before_the_true_shrink(tool: ModuleType) -> None:
    run = json.loads(RUN.read_text())
    alerts = tool._intervals(run)
    (shrink, _), (expand, _) = tool._true_changes(run, "orders", 0, 3)
    nearing, imminent, out_of_sync = (
        alerts[n] for n in ("KafkaReplicaNearingIsrShrink", "KafkaReplicaIsrShrinkImminent", "KafkaReplicaOutOfSync")
    )
    assert nearing[0] < imminent[0] < shrink
    assert out_of_sync[0] <= shrink + 1
    assert all(resolved is not None and resolved >= expand for _, resolved in (nearing, imminent, out_of_sync))
