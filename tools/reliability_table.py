"""Print issue 14's reliability table from the campaign's result files; exit 1 on a missed goal.

Each campaign test writes ``<name>.json`` to ``$ISRWATCH_VALIDATION_OUT`` (default
``<tmp>/isrwatch-validation``; ``tests.e2e.results.write_result``). The goals are stated
here, once: one row per figure with its value, its goal and whether it is met. A result
file that is missing (the test did not run, or stopped before writing it) is a missed goal.

Usage: ``python tools/reliability_table.py [--clear] [RESULTS_DIR]`` (``--clear`` removes the
campaign's earlier result files, so that a run is judged by its own; the soak's, which
``make soak`` writes in an hour of its own, is kept and judged as last recorded).
"""

from __future__ import annotations

import json
import operator
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, as make does

from validation_table import default_dir  # noqa: E402

__all__ = ["GOALS", "Goal", "rows", "main"]


@dataclass(frozen=True)
class Goal:
    item: str  # issue 14's item
    result: str  # the result file's name, without .json
    figure: str  # its key
    op: Callable[[Any, Any], bool]
    target: Any
    text: str  # the goal as the table prints it

    def met(self, value: Any) -> bool:
        return value is not None and bool(self.op(value, self.target))


# Results --clear keeps: the soak's (make soak, an hour) is judged from its last run.
KEPT = {"soak"}


def _none_left(value: Any, target: int) -> bool:
    return len(value) == target


def _at_least(value: Any, target: int) -> bool:
    return len(value) >= target


def _zero(item: str, result: str, figure: str) -> Goal:
    return Goal(item, result, figure, operator.eq, 0, "0")


KILLS = int(os.environ.get("ISRWATCH_KILLS", "20"))
# The shipped Prometheus scrape interval: a restarted exporter serves its gauges again within it.
_PROMETHEUS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheus.yml"
SCRAPE_S = float(yaml.safe_load(_PROMETHEUS.read_text())["global"]["scrape_interval"].rstrip("s"))

GOALS = [
    Goal("1 fuzz", "fuzz_campaign", "records_produced", operator.ge, 10_000, ">= 10000"),
    _zero("1 fuzz", "fuzz_campaign", "job_crashes_or_restarts"),
    _zero("1 fuzz", "fuzz_campaign", "deadletters_missing"),
    _zero("1 fuzz", "fuzz_campaign", "deadletters_unexpected"),
    _zero("1 fuzz", "fuzz_campaign", "deadletters_empty_reason"),
    _zero("1 fuzz", "fuzz_campaign", "replica_alerts_watched_cluster"),
    Goal("2 kill -9", "kill_campaign", "kills", operator.ge, KILLS, f">= {KILLS}"),
    _zero("2 kill -9", "kill_campaign", "observations_lost"),
    _zero("2 kill -9", "kill_campaign", "observations_counted_twice"),
    _zero("2 kill -9", "kill_campaign", "transitions_repeated_stdout"),
    _zero("2 kill -9", "kill_campaign", "transitions_repeated_alerts_topic"),
    _zero("2 kill -9", "kill_campaign", "transitions_missing_on_alerts_topic"),
    _zero("2 kill -9", "kill_campaign", "alerts_left_firing"),
    Goal("2 kill -9 collector, exporter", "kill_others", "collector_kills", operator.ge, KILLS, f">= {KILLS}"),
    Goal("2 kill -9 collector, exporter", "kill_others", "exporter_kills", operator.ge, KILLS, f">= {KILLS}"),
    _zero("2 kill -9 collector, exporter", "kill_others", "observations_lost"),
    _zero("2 kill -9 collector, exporter", "kill_others", "observations_counted_twice"),
    _zero("2 kill -9 collector, exporter", "kill_others", "dead_letters"),
    _zero("2 kill -9 collector, exporter", "kill_others", "replica_alerts_not_of_the_paused_follower"),
    _zero("2 kill -9 collector, exporter", "kill_others", "transitions_repeated"),
    _zero("2 kill -9 collector, exporter", "kill_others", "alerts_left_firing"),
    Goal(
        "2 kill -9 collector, exporter",
        "kill_others",
        "exporter_served_again_max_s",
        operator.le,
        SCRAPE_S,
        f"<= {SCRAPE_S:g} s (a scrape)",
    ),
    Goal(
        "3 telemetry cluster down 2 min",
        "outage_telemetry_cluster",
        "stale_episodes",
        lambda v, t: len(v) == t,
        1,
        "1 episode",
    ),
    _zero("3 telemetry cluster down 2 min", "outage_telemetry_cluster", "replica_alerts"),
    _zero("3 Alertmanager down 5 min", "outage_alertmanager", "transitions_missing"),
    _zero("3 Alertmanager down 5 min", "outage_alertmanager", "transitions_duplicated"),
    _zero("3 Alertmanager down 5 min", "outage_alertmanager", "transitions_out_of_order_alerts"),
    _zero("3 Alertmanager down 5 min", "outage_alertmanager", "alerts_active_at_alertmanager_at_end"),
    Goal("3 checkpoint disk full", "disk_full", "error_lines", operator.eq, 1, "1 line"),
    Goal("3 checkpoint disk full", "disk_full", "error_is_last_line", operator.is_, True, "yes"),
    Goal("3 checkpoint disk full", "disk_full", "traceback", operator.is_, False, "none"),
    _zero("3 checkpoint disk full", "disk_full", "transitions_repeated"),
    _zero("3 checkpoint disk full", "disk_full", "alerts_never_resolved"),
    _zero("3 checkpoint disk full", "disk_full", "observations_lost"),
    _zero("3 checkpoint disk full", "disk_full", "observations_counted_twice"),
    *(
        goal
        for ending, code in (("duration", 0), ("sigterm", 0), ("sigterm-python", 0), ("sigint", 130))
        for goal in (
            Goal(f"4 stopping: {ending}", f"stopping_{ending}", "exit_code", operator.eq, code, str(code)),
            Goal(f"4 stopping: {ending}", f"stopping_{ending}", "traceback", operator.is_, False, "none"),
            Goal(f"4 stopping: {ending}", f"stopping_{ending}", "left_in_temp", _none_left, 0, "nothing"),
        )
    ),
    *(
        goal
        for side in ("ahead", "behind")
        for goal in (
            Goal(f"5 collector clock 30 s {side}", f"clock_skew_{side}", "shrinks", operator.ge, 1, ">= 1"),
            _zero(f"5 collector clock 30 s {side}", f"clock_skew_{side}", "shrinks_not_alerted_first"),
            _zero(f"5 collector clock 30 s {side}", f"clock_skew_{side}", "dead_letters"),
            _zero(f"5 collector clock 30 s {side}", f"clock_skew_{side}", "stale_alerts"),
        )
    ),
    *(
        goal
        for direction in ("shorter", "longer")
        for goal in (
            Goal(f"5 the brokers' lag {direction}", f"wrong_lag_{direction}", "evidence_found", operator.ge, 1, ">= 1"),
            _zero(f"5 the brokers' lag {direction}", f"wrong_lag_{direction}", "evidence_wrong_way"),
        )
    ),
    # make soak's (an hour, not run by make reliability): its last result is judged
    Goal("6 soak (make soak)", "soak", "soak_s", operator.ge, 3600, ">= 3600 s"),
    Goal("6 soak (make soak)", "soak", "growing", _none_left, 0, "none"),
    Goal("6 soak (make soak)", "soak", "checkpoint_grows", operator.is_, False, "no"),
    Goal("6 soak (make soak)", "soak", "deleted_still_on_metrics", _none_left, 0, "none"),
    Goal("6 soak (make soak)", "soak", "deleted_still_in_state_table", _none_left, 0, "none"),
    Goal("6 soak (make soak)", "soak", "gone_without_deletion_or_move", _none_left, 0, "none"),
    Goal("6 soak (make soak)", "soak", "replica_alerts_unexplained", _none_left, 0, "none"),
    Goal("7 secrets", "secrets", "outputs_read", _at_least, 8, ">= 8 outputs"),
    Goal("7 secrets", "secrets", "outputs_holding_a_secret", _none_left, 0, "none"),
]


def _shown(value: Any) -> str:
    if value is None:
        return "not run"
    if isinstance(value, list):
        return str(len(value))
    return str(value)


def rows(directory: Path) -> list[tuple[Goal, Any, bool]]:
    """(goal, value or None when its result file is missing, met)."""
    results: dict[str, dict[str, Any]] = {}
    for name in {g.result for g in GOALS}:
        path = directory / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
    out = []
    for g in GOALS:
        value = results.get(g.result, {}).get(g.figure)
        out.append((g, value, g.met(value)))
    return out


def main(argv: list[str]) -> int:
    clear = "--clear" in argv
    args = [a for a in argv if a != "--clear"]
    directory = Path(args[0]) if args else default_dir()
    if clear:
        for name in {g.result for g in GOALS} - KEPT:
            (directory / f"{name}.json").unlink(missing_ok=True)
        return 0
    table = rows(directory)
    print(f"\nissue 14 reliability campaign ({directory})\n")
    print("| item | figure | value | goal | met |")
    print("|---|---|---|---|---|")
    for g, value, met in table:
        print(f"| {g.item} | {g.figure} | {_shown(value)} | {g.text} | {'yes' if met else '**NO**'} |")
    missed = [g for g, _, met in table if not met]
    print(f"\n{len(table) - len(missed)} of {len(table)} goals met" + (f"; missed: {len(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
