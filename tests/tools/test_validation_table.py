"""tools/validation_table.py: the tables from the e2e tests' result files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import validation_table  # noqa: E402

PAUSED = {
    "test": "paused_follower",
    "scenario": "follower paused",
    "lag_time_max_ms": 20000,
    "collector_interval_s": 0.5,
    "rows": [
        {
            "scenario": "paused", "topic": "orders", "partition": 0, "broker_id": 3, "fault_at": 100.0,
            "predicted_crossing_at": 109.7, "alert_arrived": 115.8, "shrink_at": 127.2,
            "lead_s": 17.5, "arrival_lead_s": 11.4,
        }
    ],
    "alerts": [[108.9, "KafkaReplicaStalled", "firing", "orders", 0, 3], [133.7, "KafkaReplicaStalled", "resolved", "orders", 0, 3]],
}  # fmt: skip
STEADY = {"test": "steady", "scenario": "steady", "shrinks": 0, "rows": [], "alerts": [],
          "deadletters": ["not_json", "missing_cluster"]}  # fmt: skip


def test_lead_rows_are_seconds_after_the_fault_with_the_floor():
    lines = validation_table.lead_table([PAUSED, STEADY])
    assert len(lines) == 3  # header, rule, one predicted replica
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["paused", "20", "orders-0 broker 3", "9.7", "15.8", "27.2", "17.5", "11.4", "9.5"]


def test_scenario_rows_count_alerts_shrinks_and_dead_letters():
    lines = validation_table.scenario_table([PAUSED, STEADY])
    assert "KafkaReplicaStalled: 1/1" in lines[2] and "| 1 |" in lines[2]
    assert "| none | 0 |" in lines[3] and "dead letters: missing_cluster, not_json" in lines[3]


def test_main_reads_a_directory_and_fails_clearly_when_empty(tmp_path, capsys):
    assert validation_table.main([str(tmp_path)]) == 1
    assert "no result files" in capsys.readouterr().err
    (tmp_path / "paused_follower.json").write_text(json.dumps(PAUSED))
    assert validation_table.main([str(tmp_path)]) == 0
    assert "orders-0 broker 3" in capsys.readouterr().out
