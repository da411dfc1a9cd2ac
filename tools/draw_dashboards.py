"""Draw the README's pictures from a real run: the main Grafana panels and the alert flow.

Grafana cannot run on these machines, so this draws the dashboards' own queries
(read from deploy/grafana/dashboards/*.json) with matplotlib, from a real
Prometheus (Debian package, loopback) that scraped the real streaming job
(Spark local mode, in this process) during the ``stuck-follower`` scenario,
evaluating the shipped rules (deploy/prometheus/rules): the run is
``tools/dashboard_run.py``, the drawing is here.

    python tools/draw_dashboards.py                      # run (~2 min), save data, draw
    python tools/draw_dashboards.py --from-data run.json # redraw from saved data

The run behind the committed pictures is saved in
tests/e2e_observability/data/stuck-follower-run.json (its test draws from it).

Writes docs/img/dashboard-fleet.png, docs/img/dashboard-replica.png and
docs/img/alert-flow.png (the stuck follower's lag ratio with the alerts the job
sent and the simulated leader's true ISR shrink and expand).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by path (the test)

from dashboard_run import FAULT, PANELS, REPLICA, legend, panel_targets, record  # noqa: E402

from isrwatch.logs import kv, setup_logging  # noqa: E402

__all__ = ["PANELS", "draw", "main", "panel_targets", "record"]

log = logging.getLogger("draw_dashboards")

# --- drawing -----------------------------------------------------------------------------

BG, PANEL, GRID, TEXT, MUTED = "#111217", "#181b1f", "#2c3235", "#d8d9da", "#8e8e8e"
STATE_COLORS = {
    "ok": "#73bf69",
    "nearing": "#fade2a",
    "critical": "#ff9830",
    "out_of_sync": "#f2495c",
    "stalled": "#b877d9",
}
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0", "#508642", "#cca300"]


def _figure(n: int, title: str) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 3.9), facecolor=BG)
    axes = list(axes) if n > 1 else [axes]
    fig.suptitle(title, color=TEXT, fontsize=12, x=0.01, ha="left")
    for ax in axes:
        ax.set_facecolor(PANEL)
        ax.tick_params(colors=MUTED, labelsize=8)
        for spine in ax.spines.values():
            spine.set_color(GRID)
        ax.grid(True, color=GRID, linewidth=0.6)
        ax.set_xlabel("seconds since the scenario started", color=MUTED, fontsize=8)
    return fig, axes


def _panel_title(ax: Any, title: str) -> None:
    ax.set_title(title, color=TEXT, fontsize=10, loc="left")


def _legend(ax: Any, **kw: Any) -> None:
    leg = ax.legend(fontsize=7, facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT, **kw)
    leg.get_frame().set_alpha(0.9)


def _fault_band(ax: Any) -> None:
    ax.axvspan(*FAULT, color="#f2495c", alpha=0.08, lw=0, zorder=0)


def _x(data: dict[str, Any], ts: list[float]) -> list[float]:
    return [t - data["start_ms"] / 1000 for t in ts]


def _true_changes(data: dict[str, Any], topic: str, partition: int, broker: int) -> list[tuple[float, str]]:
    out = []
    for c in data["truth"]:
        if c["topic"] == topic and c["partition"] == partition and broker in c["brokers"]:
            out.append(((c["t_ms"] - data["start_ms"]) / 1000, c["change"]))
    return out


def draw_fleet(data: dict[str, Any], path: Path) -> None:
    fig, (left, right) = _figure(2, "isrwatch / Fleet overview  (cluster sim, scenario stuck-follower)")
    panel = data["panels"]["fleet_states"]
    by_state = {s["labels"].get("state", ""): s for t in panel["targets"] for s in t["series"]}
    order = [s for s in STATE_COLORS if s in by_state]
    xs = _x(data, by_state[order[0]]["t"]) if order else []
    if order:
        left.stackplot(
            xs,
            [by_state[s]["v"] for s in order],
            labels=[s.replace("_", " ") for s in order],
            colors=[STATE_COLORS[s] for s in order],
            alpha=0.75,
        )
    _fault_band(left)
    _panel_title(left, panel["title"])
    left.set_ylabel("follower replicas", color=MUTED, fontsize=8)
    _legend(left, loc="lower left", ncol=len(order))

    panel = data["panels"]["fleet_top"]
    target = panel["targets"][0]
    ranked = sorted(target["series"], key=lambda s: -max(s["v"]))
    for i, s in enumerate(ranked):
        # The two stuck partitions share one curve: the second one dashed, so both show.
        right.plot(_x(data, s["t"]), s["v"], color=PALETTE[i % len(PALETTE)], lw=1.4 if i < 2 else 0.9,
                   ls="--" if i == 1 else "-", label=legend(target["legend"], s["labels"]))  # fmt: skip
    right.axhline(1.0, color="#f2495c", ls="--", lw=0.9)
    right.text(0.5, 1.02, "replica.lag.time.max.ms", color="#f2495c", fontsize=7)
    _fault_band(right)
    _panel_title(right, panel["title"])
    right.set_ylabel("lag ratio", color=MUTED, fontsize=8)
    _legend(right, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100, facecolor=BG)


def draw_replica(data: dict[str, Any], path: Path) -> None:
    who = f"{REPLICA['topic']}-{REPLICA['partition']} broker {REPLICA['broker']}"
    fig, (left, right) = _figure(2, f"isrwatch / Replica drill-down  ({who}, leader 1)")
    panel = data["panels"]["replica_since"]
    for t in panel["targets"]:
        for s in t["series"]:
            dashed = t["ref"] == "B"
            left.plot(_x(data, s["t"]), s["v"], lw=1.2, ls="--" if dashed else "-",
                      color="#f2495c" if dashed else "#6ed0e0", label=legend(t["legend"], s["labels"]))  # fmt: skip
    for x, change in _true_changes(data, REPLICA["topic"], int(REPLICA["partition"]), int(REPLICA["broker"])):
        left.axvline(x, color="#b877d9", lw=0.9, ls=":")
        left.text(x + 0.5, 1.0, f"true ISR {change}", color="#b877d9", fontsize=7)
    _fault_band(left)
    _panel_title(left, panel["title"])
    left.set_ylabel("seconds", color=MUTED, fontsize=8)
    _legend(left, loc="upper left")

    panel = data["panels"]["replica_shrink"]
    for t in panel["targets"]:
        for s in t["series"]:
            right.plot(_x(data, s["t"]), s["v"], lw=1.2, color="#eab839", label=legend(t["legend"], s["labels"]))
    _fault_band(right)
    _panel_title(right, panel["title"])
    right.set_ylabel("seconds until the earliest removal", color=MUTED, fontsize=8)
    _legend(right, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100, facecolor=BG)


ALERT_STYLE = {
    "KafkaReplicaNearingIsrShrink": ("Nearing", "#fade2a"),
    "KafkaReplicaIsrShrinkImminent": ("Imminent", "#ff9830"),
    "KafkaReplicaOutOfSync": ("OutOfSync", "#f2495c"),
}


def _iso_s(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _intervals(data: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """The drilled-down replica's alerts from the job: name -> (fired, resolved)."""
    out: dict[str, tuple[float, float | None]] = {}
    for e in data["alerts"]:
        labels = e["labels"]
        if (labels.get("topic"), labels.get("partition"), labels.get("broker_id")) != (
            REPLICA["topic"],
            REPLICA["partition"],
            REPLICA["broker"],
        ):
            continue
        start = _iso_s(e["startsAt"]) - data["start_ms"] / 1000
        if e["status"] == "firing":
            out.setdefault(labels["alertname"], (start, None))
        else:
            out[labels["alertname"]] = (start, _iso_s(e["endsAt"]) - data["start_ms"] / 1000)
    return out


def draw_alert_flow(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = (data["end_ms"] - data["start_ms"]) / 1000
    fig, (top, ax) = plt.subplots(
        2, 1, figsize=(12.8, 5.6), sharex=True, facecolor=BG, gridspec_kw={"height_ratios": [1.2, 2]}
    )
    fig.suptitle(
        "Alert flow: the stuck follower orders-0 on broker 3 (leader 1, replica.lag.time.max.ms = 10 s)",
        color=TEXT,
        fontsize=12,
        x=0.01,
        ha="left",
    )
    for a in (top, ax):
        a.set_facecolor(PANEL)
        a.tick_params(colors=MUTED, labelsize=8)
        for spine in a.spines.values():
            spine.set_color(GRID)
        a.grid(True, axis="x", color=GRID, linewidth=0.6)
        a.axvspan(*FAULT, color="#f2495c", alpha=0.08, lw=0, zorder=0)

    # Top: the alerts the job sent, and the leader's true ISR membership.
    truth = _true_changes(data, REPLICA["topic"], int(REPLICA["partition"]), int(REPLICA["broker"]))
    alerts = _intervals(data)
    rows = [*ALERT_STYLE, "isr"]
    for i, name in enumerate(rows):
        y = len(rows) - 1 - i
        if name == "isr":
            edges = [0.0, *(x for x, _ in truth), span]
            inside = True
            for a, b in zip(edges, edges[1:], strict=False):
                top.barh(y, b - a, left=a, height=0.5, color="#73bf69" if inside else "#f2495c", alpha=0.75)
                inside = not inside
            for x, change in truth:
                top.text(x + 0.4, y + 0.32, f"{change} {x:.1f}s", color=TEXT, fontsize=7)
            continue
        short, color = ALERT_STYLE[name]
        if name not in alerts:
            continue
        fired, resolved = alerts[name]
        top.barh(y, (resolved or span) - fired, left=fired, height=0.5, color=color, alpha=0.85)
        top.text(fired - 0.5, y, f"fires {fired:.0f}s", color=color, fontsize=8, ha="right", va="center")
        if resolved is not None:
            top.text(resolved + 0.5, y, f"resolved {resolved:.0f}s", color=color, fontsize=8, va="center")
    top.set_yticks(range(len(rows)))
    labels = [ALERT_STYLE[n][0] + " (job)" if n in ALERT_STYLE else "in ISR (truth)" for n in rows]
    top.set_yticklabels(labels[::-1], color=TEXT, fontsize=8)  # y counts up from the bottom row
    top.set_ylim(-0.6, len(rows) - 0.4)
    top.text(FAULT[0] + 0.3, len(rows) - 0.55, "fetcher stopped", color=MUTED, fontsize=7, va="top")
    top.text(FAULT[1] + 0.3, len(rows) - 0.55, "fetcher resumed", color=MUTED, fontsize=7, va="top")

    # Bottom: the lag ratio Prometheus scraped from the job, against the alert thresholds.
    target = data["panels"]["replica_ratio"]["targets"][0]
    label = "lag ratio, as Prometheus scraped it"
    nearing = alerts.get("KafkaReplicaNearingIsrShrink")
    for s in target["series"]:
        xs = _x(data, s["t"])
        seen = next((x for x, v in zip(xs, s["v"], strict=True) if v >= 0.5 and nearing and x >= nearing[0]), None)
        if nearing and seen is not None:
            # The alerts carry the telemetry time; a scrape shows a value after the job's micro-batch.
            label += f" ({seen - nearing[0]:.0f} s after the telemetry time the alerts carry)"
        ax.plot(xs, s["v"], color="#6ed0e0", lw=1.6, label=label)
    for level, name in ((0.5, "KafkaReplicaNearingIsrShrink"), (0.8, "KafkaReplicaIsrShrinkImminent"),
                        (1.0, "KafkaReplicaOutOfSync")):  # fmt: skip
        short, color = ALERT_STYLE[name]
        ax.axhline(level, color=color, lw=0.8, ls="--")
        ax.text(span - 0.3, level + 0.02, f"{short} {level:g}", color=color, fontsize=7, ha="right", va="bottom")
    for x, _ in truth:
        for a in (top, ax):
            a.axvline(x, color="#b877d9", lw=1.0, ls=":")
    ax.set_ylim(0, 1.5)
    ax.set_xlim(0, span)
    ax.grid(True, axis="y", color=GRID, linewidth=0.6)
    ax.set_ylabel("lag ratio (clipped at 1.5)", color=MUTED, fontsize=8)
    ax.set_xlabel("seconds since the scenario started", color=MUTED, fontsize=8)
    _legend(ax, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100, facecolor=BG)


def draw(data: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "dashboard-fleet.png", out / "dashboard-replica.png", out / "alert-flow.png"]
    draw_fleet(data, paths[0])
    draw_replica(data, paths[1])
    draw_alert_flow(data, paths[2])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go")
    parser.add_argument("--save-data", type=Path, help="also write the recorded series here (JSON)")
    parser.add_argument("--from-data", type=Path, help="draw from saved series instead of running")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    if args.from_data:
        data = json.loads(args.from_data.read_text())
    else:
        data = record()
        if args.save_data:
            args.save_data.write_text(json.dumps(data))
    for p in draw(data, args.out):
        log.info(kv(event="drawn", path=p, bytes=p.stat().st_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
