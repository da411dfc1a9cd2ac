"""Smoke test: the layouts benchmark turns the same fleet into each layout, Spark reads the
same observations out of each (the benchmark checks it), and the dense layouts are smaller.
No timing asserted."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession

from bench import layouts
from bench.load import Fleet


def test_the_dense_layouts_hold_the_same_observations_in_fewer_bytes() -> None:
    """Pure Python: every observation of the version-1 record is in each dense layout."""
    record = Fleet(10, per_record=10).round(1, 1_000_000)[0]
    v1 = json.loads(record)["observations"]
    nested = json.loads(layouts.nested(record))
    got = [{**{k: p[k] for k in layouts.PARTITION_FIELDS}, **f} for p in nested["partitions"] for f in p["followers"]]
    assert sorted(map(repr, (dict(sorted(o.items())) for o in got))) == sorted(
        map(repr, (dict(sorted(o.items())) for o in v1))
    )
    col = json.loads(layouts.columnar(record))
    fol, parts = col["followers"], col["partitions"]
    rebuilt = []
    for i, p in enumerate(fol["p"]):
        o = {f: fol[f][i] for f in layouts.FOLLOWER_FIELDS}
        o.update({f: parts[f][p] for f in layouts.PARTITION_FIELDS})
        o["topic"] = col["topics"][o["topic"]]
        rebuilt.append(dict(sorted(o.items())))
    assert rebuilt == [dict(sorted(o.items())) for o in v1]
    assert len(layouts.columnar(record)) < len(layouts.nested(record)) < len(record)


@pytest.mark.integration
def test_layouts_reads_every_layout_on_a_tiny_fleet() -> None:
    # Not the shared `spark` fixture (see tests/bench/test_stages.py): the benchmark's own
    # session, or one another test left active, not stopped.
    shared = SparkSession.getActiveSession()
    if shared is not None:
        out = layouts.measure(shared, 200, 2, repeat=1)
    else:
        out = layouts.main(["--replicas", "200", "--rounds", "2", "--repeat", "1"])
    assert set(out) == set(layouts.LAYOUTS)
    for m in out.values():
        assert m["parse_s"] > 0
    assert out["columnar"]["bytes_per_obs"] < out["nested"]["bytes_per_obs"] < out["v1"]["bytes_per_obs"]
