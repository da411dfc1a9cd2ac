"""The recording a replay reads: telemetry records as bytes, in the order they were written.

* a spool directory (``isrwatch simulate --spool-dir``, the embedded default's spool);
* a file of telemetry records, one per line (``isrwatch simulate`` to stdout, a topic
  dumped with a console consumer); blank lines are skipped, every other line is a record
  (a bad one is counted as rejected by the replay, as the job would);
* a simulated scenario, run as fast as it computes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.spool import SpoolReader

__all__ = ["read_recording", "simulated"]

log = logging.getLogger(__name__)

_PROGRESS_EVERY = 50_000


def _file_records(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        for line in fh:
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield line


def read_recording(path: str) -> list[bytes]:
    """Every record of the spool directory or line file at ``path``; logs progress."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--input {path}: no such file or directory")
    if p.is_dir():
        reader = SpoolReader(p)
        end = reader.end_offset()
        if end == 0:
            raise ConfigError(f"--input {path}: a directory, but no spool segments (<start>-<end>.jsonl) in it")
        it: Iterator[bytes] = (r for _, r in reader.read(0, end))
    else:
        it = _file_records(p)
    records = []
    for record in it:
        records.append(record)
        if len(records) % _PROGRESS_EVERY == 0:
            log.info(kv(event="replay_reading", records=len(records), path=path))
    if not records:
        raise ConfigError(f"--input {path}: no telemetry records in it")
    log.info(kv(event="replay_read", records=len(records), path=path))
    return records


def simulated(scenario: str, duration_s: float, seed: int, interval_ms: int, mode: str) -> list[bytes]:
    """The telemetry of ``scenario`` over ``duration_s`` simulated seconds, computed without
    waiting: rounds every ``interval_ms`` (``mode`` poll, as the collector) or one observation
    per follower fetch (``mode`` fetch, what the leader itself sees)."""
    from simulator.run import iter_records  # the simulator only for --simulate (demo wiring)

    rounds = iter_records(scenario, seed=seed, duration_s=duration_s, interval_ms=interval_ms, mode=mode)
    records = [r for _, batch in rounds for r in batch]
    log.info(kv(event="replay_simulated", scenario=scenario, duration_s=duration_s, mode=mode, records=len(records)))
    return records
