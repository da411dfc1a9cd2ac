"""``make bench``: every benchmark, in one run (tens of minutes on 2 cores).

Throughput at 10k, 100k and 1M replicas (``bench.throughput``), the 1M fleet
observed every 5 s at the 1 s trigger (``bench.scale``), the
per-stage profile (``bench.stages``), alert latency (``bench.latency``) and
the exporter scrape (``bench.exposure``). Results go to
``bench/results/latest.json`` and the chart to ``docs/img/benchmarks.png``;
docs/benchmarks.md is written by hand from them.

``python -m bench.all [--skip latency,exposure,...]``
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from bench import chart, exposure, latency, stages
from bench import kafka as bkafka
from bench import scale as bscale
from bench import throughput as tp
from bench.machine import print_header

__all__ = ["main", "RESULTS"]

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"

# 1M replicas: the driver evaluates every replica each batch (minutes per batch here), so the
# 1M end-to-end figure comes from the scale run (1M replicas, 200k observations a batch).
SIZES = ((10_000, 100), (100_000, 20))


def _plain(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        d = asdict(x)
        for k in ("ceiling_ratio", "naive_ratio"):
            if hasattr(x, k):
                d[k] = getattr(x, k)
        return d
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.all", description=__doc__.splitlines()[0])
    ap.add_argument("--skip", default="", help="comma-separated: throughput,scale,stages,latency,exposure")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--naive-batch-observations", type=int, default=100_000)
    ap.add_argument("--naive-budget", type=float, default=180.0)
    args = ap.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    results: dict[str, Any] = {"header": print_header("isrwatch benchmarks (all)")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(results, indent=1, default=_plain))

    if not {"throughput", "scale", "stages"} <= skip:
        from streaming.lifecycle.session import build_session

        spark = build_session("local[2]", 2, app_name="isrwatch-bench")
        kafka = bkafka.start_cluster()
        try:
            if "throughput" not in skip:
                results["throughput"] = []
                for replicas, rounds in SIZES:
                    r = tp.measure(
                        spark,
                        kafka,
                        replicas,
                        rounds,
                        naive_batch_obs=args.naive_batch_observations,
                        naive_budget_s=args.naive_budget,
                    )
                    results["throughput"].append(_plain(r))
                    save()
            if "scale" not in skip:
                results["scale"] = bscale.scale(spark, kafka, 1_000_000, batch_obs=200_000)
                save()
            if "stages" not in skip:
                results["stages"] = stages.measure(spark, kafka, 100_000, 2)
                save()
        finally:
            kafka.close()
            spark.stop()
    if "latency" not in skip:
        results["latency"] = latency.run()
        save()
    if "exposure" not in skip:
        results["exposure"] = [
            asdict(s) for s in exposure.main(["--replicas", "1100,11000,100000", "--large", "1000000"])
        ]
        save()
    save()
    print(f"results: {out}")
    print(f"chart: {chart.draw(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
