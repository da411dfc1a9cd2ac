"""The chart of docs/benchmarks.md (docs/img/benchmarks.png) from ``bench.all``'s JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["draw", "main"]

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "benchmarks.png"


def draw(results: dict[str, Any], out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    tp = results.get("throughput") or []
    ax = axes[0]
    if tp:
        names = [
            ("input", "input ceiling (consumer)"),
            ("ceiling", "in-memory aggregation"),
            ("e2e", "end to end (job)"),
            ("naive", "naive (TWS in pandas)"),
        ]
        width = 0.2
        for k, (key, label) in enumerate(names):
            xs = [i + (k - 1.5) * width for i in range(len(tp))]
            ax.bar(xs, [max(r.get(key) or 0, 1) for r in tp], width, label=label)
        ax.set_xticks(range(len(tp)), [f"{r['replicas']:,}" for r in tp])
        ax.set_yscale("log")
        ax.axhline(300_000, color="k", linestyle="--", linewidth=0.8, label="target 300k/s")
        ax.set_xlabel("distinct replicas")
        ax.set_ylabel("observations / s (log)")
        ax.set_title("Throughput, 2 cores, local[2]")
        ax.legend(fontsize=7)
    lat = results.get("latency") or {}
    ax = axes[1]
    data = [lat.get(p, {}).get("values") or [0] for p in ("job", "rules")]
    if lat:
        ax.boxplot(data, whis=(0, 100))
        ax.set_xticks([1, 2], ["job -> Alertmanager", "exporter -> Prometheus\nrules -> Alertmanager"])
        ax.axhline(2.0, color="k", linestyle="--", linewidth=0.8, label="target p99 2 s")
        ax.set_ylabel("seconds from publish to alert held")
        ax.set_title(f"Alert latency ({lat.get('crossings', 0)} crossings)")
        ax.legend(fontsize=7)
    ex = [s for s in results.get("exposure") or [] if s["mode"] == "all"]
    ax = axes[2]
    if ex:
        ax.loglog([s["series"] for s in ex], [s["median_s"] for s in ex], "o-", label="replica_series=all")
        ctl = [s for s in results.get("exposure") or [] if s["mode"] != "all"]
        for s in ctl:
            ax.plot([s["series"]], [s["median_s"]], "s", label=f"{s['replicas']:,} replicas, {s['mode']}")
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8, label="target 1 s")
        ax.axvline(100_000, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("series in the response")
        ax.set_ylabel("scrape seconds (median)")
        ax.set_title("Exporter scrape")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if not args:
        print("usage: python -m bench.chart RESULTS.json [OUT.png]")
        return 2
    results = json.loads(Path(args[0]).read_text())
    print(draw(results, Path(args[1]) if len(args) > 1 else OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
