"""Exposure: exporter scrape time and response size against series.

A ``exporter.store.StatusStore`` filled with N replica statuses (a fleet of
``bench.load.Fleet``'s shape, 0.5% of replicas not ok) is served by the real
``exporter.server.serve``; the scrape is a plain HTTP GET of ``/metrics`` on
loopback, timed from request to last byte. Series are counted in the
response. For the large fleet the documented cardinality controls
(``--replica-series not-ok``, ``--replica-series-top N`` and, with
``--replica-series not-ok``, ``--partition-series at-risk``; docs/metrics.md)
are measured too.

``python -m bench.exposure --replicas 1100,11000,100000 --large 1000000``
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import dataclass

import requests

from bench.load import Fleet
from bench.machine import print_header, rss_mb
from exporter.server import serve
from exporter.store import StatusStore
from isrwatch.status import ReplicaStatus, State

__all__ = ["Scrape", "fill_store", "scrape", "main"]

_NOT_OK = (State.NEARING, State.CRITICAL, State.OUT_OF_SYNC, State.STALLED)


@dataclass
class Scrape:
    replicas: int
    mode: str
    series: int
    bytes: int
    first_s: float
    median_s: float
    max_s: float


def fill_store(replicas: int, now_ms: int = 1_767_225_600_000, not_ok_every: int = 200) -> StatusStore:
    fleet = Fleet(replicas)
    store = StatusStore()
    batch: list[ReplicaStatus] = []
    for i, (topic, partition, broker) in enumerate(fleet.keys):
        bad = i % not_ok_every == 0
        state = _NOT_OK[(i // not_ok_every) % len(_NOT_OK)] if bad else State.OK
        age = 6.5 if bad else 0.0
        batch.append(
            ReplicaStatus(
                cluster=fleet.cluster,
                topic=topic,
                partition=partition,
                broker_id=broker,
                leader_id=1 + (i // 2) % 3,
                eval_ms=now_ms,
                state=state,
                time_since_caught_up_s=age,
                lag_ratio=age / 10.0,
                time_to_shrink_s=max(0.0, 10.0 - age),
                offset_lag=300 if bad else 0,
                in_isr=True,
                isr_size=3,
                min_isr=2,
                lag_time_max_ms=10_000,
                shrink_window_start_ms=now_ms + int((10.0 - age) * 1000),
                shrink_window_end_ms=now_ms + int((15.0 - age) * 1000),
            )
        )
        if len(batch) >= 10_000:
            store.update(batch)
            batch = []
    store.update(batch)
    store.set_telemetry_time(fleet.cluster, now_ms)
    return store


def scrape(
    store: StatusStore, replicas: int, mode: str = "all", top: int = 0, partitions: str = "all", repeat: int = 5
) -> Scrape:
    server = serve(
        store,
        "127.0.0.1",
        0,
        default_min_isr=2,
        replica_series=mode,
        replica_series_top=top,
        partition_series=partitions,
    )
    try:
        times = []
        body = b""
        with requests.Session() as http:
            for _ in range(repeat):
                gc.collect()
                t0 = time.perf_counter()
                resp = http.get(server.url, timeout=300)
                body = resp.content
                times.append(time.perf_counter() - t0)
                resp.raise_for_status()
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        label = (
            mode + (f" top={top}" if top else "") + (f" partition_series={partitions}" if partitions != "all" else "")
        )
        return Scrape(replicas, label, series, len(body), times[0], statistics.median(times[1:] or times), max(times))
    finally:
        server.close()


def _print(s: Scrape) -> None:
    print(
        f"replicas={s.replicas} replica_series={s.mode!r} series={s.series} bytes={s.bytes} "
        f"first_s={s.first_s:.3f} median_s={s.median_s:.3f} max_s={s.max_s:.3f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> list[Scrape]:
    ap = argparse.ArgumentParser(prog="python -m bench.exposure", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1100,11000,100000", help="fleet sizes served in full (comma-separated)")
    ap.add_argument("--large", type=int, default=1_000_000, help="fleet size served with cardinality control (0: skip)")
    ap.add_argument("--top", type=int, default=1000, help="--replica-series-top for the large fleet")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    print_header("isrwatch exposure: exporter scrape time and size")
    out: list[Scrape] = []
    for n in [int(x) for x in args.replicas.split(",") if x]:
        store = fill_store(n)
        out.append(scrape(store, n))
        _print(out[-1])
        del store
    if args.large:
        t0 = time.perf_counter()
        store = fill_store(args.large)
        print(f"large fleet: {args.large} replicas stored in {time.perf_counter() - t0:.1f}s, rss_mb={rss_mb()}")
        # In full (replica_series=all) a 1M fleet is ~10M series and ~1.2 GB a scrape: not a
        # configuration to run; the controls are what docs/metrics.md prescribes for it.
        for mode, top, partitions in (("not-ok", 0, "all"), ("not-ok", args.top, "all"), ("not-ok", 0, "at-risk")):
            out.append(scrape(store, args.large, mode, top, partitions))
            _print(out[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump([s.__dict__ for s in out], f, indent=1)
    return out


if __name__ == "__main__":
    main()
