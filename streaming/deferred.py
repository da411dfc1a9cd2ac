"""Ranges a read task could not finish, read again in a later micro-batch.

A range is planned from offsets its leader has just reported, but the leader can
hang between planning and reading (measured: the first batch after a SIGSTOP
waited 30+ s on two ranges). Waiting holds the whole job; dropping the rest of
the range loses telemetry. Instead a task that gets nothing from its leader for
``SHORT_READ_S`` stops, hands Spark what it read, and writes how far it got; the
driver starts that partition's next range there, once the leader answers again.

Everything lives in files under the source's state directory (beside Spark's
checkpoint, so on a Spark cluster it is on the shared checkpoint storage):

* ``plans/<digest of start offsets>.json``: the ranges planned for the batch that
  starts at those offsets, and ``resume`` (partition -> first offset not yet
  read, where that is before the batch's start). Written before the tasks run
  and reused when Spark re-plans the same batch after a crash, so a replayed
  batch reads exactly the same ranges.
* ``short/<topic>-<partition>-<start>-<end>.json``: ``{"upto": n}``, written by
  a task that stopped short of ``end``; removed when a replay reads it whole.

The next plan finds the previous one by its end offsets (the next batch's start).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Deferred", "SHORT_READ_S", "SHORT_READ_NEW_S", "offsets_digest"]

# A read task that gets no record for this long stops short and defers the rest: a
# consumer that has read from the partition before (kept between batches), whose
# leader answers in milliseconds when it answers at all; and a consumer new to the
# partition, which first connects and asks for metadata. (With 3 s for both, the
# first batch of a pause waited 3-4 s, time the lookahead lacks before a crossing.)
SHORT_READ_S = 1.0
SHORT_READ_NEW_S = 3.0
# Kept by tidy: the newest plans (a restart replays the newest batch, and the next plan needs
# only the one before it; Spark itself keeps 100 batches), and short reads for an hour. An hour
# of plans was 2,070 files after the soak's 1,035 batches, 7,200 at one batch a second.
_KEEP_PLANS = 500
_KEEP_SHORT_S = 3600.0

Offsets = dict[str, dict[str, int]]
Range = tuple[str, int, int, int]  # topic, partition, start, end


def offsets_digest(offsets: Offsets) -> str:
    canonical = json.dumps({t: {p: int(o) for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())})
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class Deferred:
    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir)

    # -- tasks ----------------------------------------------------------------

    def _short_path(self, r: Range) -> Path:
        topic, partition, start, end = r
        return self.dir / "short" / f"{topic}-{partition}-{start}-{end}.json"

    def stopped_short(self, r: Range, upto: int) -> None:
        """A task read ``r`` only up to ``upto`` (exclusive)."""
        _write(self._short_path(r), {"upto": int(upto)})

    def read_whole(self, r: Range) -> None:
        """A task read all of ``r`` (a replay may succeed where the first try stopped short)."""
        self._short_path(r).unlink(missing_ok=True)

    # -- the driver -----------------------------------------------------------

    def plan(
        self, start: Offsets, end: Offsets, late: set[tuple[str, int]], first: Offsets | None = None
    ) -> tuple[list[Range], dict[str, int]]:
        """The ranges of the batch (start, end] and the partitions still owed from earlier
        ones (``"topic/partition" -> offset``). The same answer every time for the same start.
        ``first``: where a partition missing from ``start`` (new in this batch) begins (else 0)."""
        digest = offsets_digest(start)
        if digest == offsets_digest(end):
            # Nothing new (Spark asked for an empty range: the restarted job did, once, before
            # replaying its batch in flight). Nothing is read and nothing written: a plan for it
            # would link its end to itself and hide what the batch that ended at ``start`` left
            # unread (tests/e2e/test_restart.py lost a range its replay read short that way).
            return [], self._owed(start)
        saved = _read(self.dir / "plans" / f"{digest}.json")
        if isinstance(saved, dict) and saved.get("end") == end:
            return [tuple(r) for r in saved["ranges"]], dict(saved["resume"])  # type: ignore[misc]
        resume = self._owed(start)
        ranges: list[Range] = []
        for topic, parts in end.items():
            for p, hi in parts.items():
                key = f"{topic}/{p}"
                begin = start.get(topic, {}).get(p, (first or {}).get(topic, {}).get(p, 0))
                lo = resume.get(key, int(begin))
                if hi <= lo:
                    continue
                if key in resume and (topic, int(p)) in late:
                    continue  # owed, but its leader still does not answer: keep owing
                ranges.append((topic, int(p), lo, int(hi)))
        _write(self.dir / "plans" / f"{digest}.json", {"start": start, "end": end, "ranges": ranges, "resume": resume})
        _write(self.dir / "plans" / "by-end" / f"{offsets_digest(end)}.json", {"start_digest": digest})
        return ranges, resume

    def _owed(self, start: Offsets) -> dict[str, int]:
        """What the batch that ended at ``start`` left unread, and what it still owed itself."""
        link = _read(self.dir / "plans" / "by-end" / f"{offsets_digest(start)}.json")
        prev = _read(self.dir / "plans" / f"{link['start_digest']}.json") if isinstance(link, dict) else None
        if not isinstance(prev, dict):
            return {}
        owed: dict[str, int] = {}
        planned = {f"{t}/{p}" for t, p, _, _ in prev["ranges"]}
        for key, lo in prev["resume"].items():
            if key not in planned:
                owed[key] = int(lo)
        for r in prev["ranges"]:
            short = _read(self._short_path(tuple(r)))  # type: ignore[arg-type]
            if isinstance(short, dict) and int(short["upto"]) < r[3]:
                owed[f"{r[0]}/{r[1]}"] = int(short["upto"])
        return owed

    def tidy(self, keep: int = _KEEP_PLANS, keep_short_s: float = _KEEP_SHORT_S) -> None:
        """Forget all but the newest ``keep`` plans (and their links by end), and short reads
        older than ``keep_short_s`` (committed long ago)."""
        for sub in ("plans", "plans/by-end"):
            files = self._files(sub)
            for _, f in sorted(files, reverse=True)[keep:]:
                f.unlink(missing_ok=True)
        cutoff = time.time() - keep_short_s
        for mtime, f in self._files("short"):
            if mtime < cutoff:
                f.unlink(missing_ok=True)

    def _files(self, sub: str) -> list[tuple[float, Path]]:
        """(modification time, path) of the files in ``sub``."""
        folder = self.dir / sub
        out = []
        if folder.is_dir():
            for f in folder.iterdir():
                try:
                    if f.is_file():
                        out.append((f.stat().st_mtime, f))
                except OSError:
                    pass  # gone meanwhile
        return out
