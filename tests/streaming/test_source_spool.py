"""The spool source: capped micro-batches, Arrow rows with the Kafka columns, restart from the checkpoint."""

from __future__ import annotations

import pytest

from isrwatch.spool import SpoolWriter
from streaming.sources.source import spool_stream

pytestmark = pytest.mark.spark


def _run_once(spark, raw, checkpoint):
    got = []

    def handle(batch, batch_id):
        got.append((batch_id, [(r.offset, r.value, r.topic, r.partition) for r in batch.collect()]))

    q = (
        raw.writeStream.foreachBatch(handle)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    return [g for g in got if g[1]]


def test_batches_are_capped_and_restart_continues(spark, tmp_path) -> None:
    spool = tmp_path / "spool"
    w = SpoolWriter(spool)
    w.append([f'{{"i":{i}}}'.encode() for i in range(7)])
    w.append([b'{"i":7}', b'{"i":8}'])
    raw = spool_stream(spark, str(spool), max_records_per_trigger=4)
    assert raw("test").schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp>"
    )
    first = _run_once(spark, raw("test"), str(tmp_path / "ck"))
    assert [len(rows) for _, rows in first] == [4, 4, 1]
    offsets = [o for _, rows in first for o, *_ in rows]
    assert offsets == list(range(9))
    assert first[0][1][0][1] == b'{"i":0}'

    w.append([b'{"i":9}', b'{"i":10}'])
    again = _run_once(spark, raw("test"), str(tmp_path / "ck"))
    assert [o for _, rows in again for o, *_ in rows] == [9, 10]
    assert again[0][0] == first[-1][0] + 1
