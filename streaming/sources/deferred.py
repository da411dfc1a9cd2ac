"""Ranges a read task could not finish, read again in a later micro-batch.

A range is planned from offsets its leader has just reported, but the leader can
hang between planning and reading (measured: the first batch after a SIGSTOP
waited 30+ s on two ranges). Waiting holds the whole job; dropping the rest of
the range loses telemetry. Instead a task that gets nothing from its leader for
``SHORT_READ_S`` stops, hands Spark what it read, and records how far it got; the
driver starts that partition's next range there, once the leader answers again.

A batch can read one range more than once: on a Spark cluster two executors can
each compute the same partition of the batch's held records at the same moment
(measured: the same range read twice in one stage), and a lost executor's
partitions are read again. Every read of a range must then hand Spark the same
records, or the batch counts what the next batch reads again (or loses what it
skips). So the first read to finish decides where the range ends for the batch
(``decide``: a file created once, never replaced) and every other read of it in
that run of the batch, at the same time or later, reads exactly that far
(``streaming.sources.range_read``). A replay after a restart decides afresh
(``forget_reads``): the run before it never committed.

Everything lives in files under the source's state directory (beside Spark's
checkpoint, so on a Spark cluster it is on the shared checkpoint storage):

* ``plans/<digest of start offsets>.json``: the ranges planned for the batch that
  starts at those offsets, and ``resume`` (partition -> first offset not yet
  read, where that is before the batch's start). Written before the tasks run
  and reused when Spark re-plans the same batch after a crash, so a replayed
  batch reads exactly the same ranges.
* ``reads/<plan id>/<topic>-<partition>-<start>-<end>.json``: ``{"upto": n}``, how far
  the batch reads the range (``end`` when whole). Only the newest batch's are kept.
* ``short/<topic>-<partition>-<start>-<end>.json``: the same for a short read, as
  versions before the ``reads`` files wrote it; read for a checkpoint they left.

The next plan finds the previous one by its end offsets (the next batch's start).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

__all__ = ["Deferred", "SHORT_READ_S", "SHORT_READ_NEW_S", "offsets_digest", "plan_id"]

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


def plan_id(start: Offsets, end: Offsets) -> str:
    """The batch (start, end]'s name among the ``reads`` files: the same on a replay."""
    return hashlib.sha256((offsets_digest(start) + offsets_digest(end)).encode()).hexdigest()[:32]


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read(path: Path) -> object:
    """The JSON value in ``path`` (None when it cannot be read); each caller checks its shape."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class Deferred:
    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir)

    # -- tasks ----------------------------------------------------------------

    def _read_path(self, plan: str, r: Range) -> Path:
        topic, partition, start, end = r
        return self.dir / "reads" / plan / f"{topic}-{partition}-{start}-{end}.json"

    def decided(self, plan: str, r: Range) -> int | None:
        """Where batch ``plan`` reads ``r`` up to (exclusive), if a read of it has decided."""
        found = _read(self._read_path(plan, r))
        return int(found["upto"]) if isinstance(found, dict) else None

    def decide(self, plan: str, r: Range, upto: int) -> int:
        """Batch ``plan`` reads ``r`` up to ``upto``, unless a read of it decided first:
        where the batch reads it up to, either way. The file is linked into place whole,
        so a reader sees all of it or none, and once there it is never replaced."""
        path = self._read_path(plan, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        tmp.write_text(json.dumps({"upto": int(upto)}), encoding="utf-8")
        try:
            os.link(tmp, path)
            return int(upto)
        except FileExistsError:
            found = self.decided(plan, r)
            return int(upto) if found is None else found
        finally:
            tmp.unlink(missing_ok=True)

    # -- the driver -----------------------------------------------------------

    def plan(
        self,
        start: Offsets,
        end: Offsets,
        late: set[tuple[str, int]],
        first: Offsets | None = None,
        back: dict[str, int] | None = None,
    ) -> tuple[list[Range], dict[str, int]]:
        """The ranges of the batch (start, end] and the partitions still owed from earlier
        ones (``"topic/partition" -> offset``). The same answer every time for the same start.
        ``first``: where a partition missing from ``start`` (new in this batch) begins (else 0).
        ``back``: partitions whose log went back, read from there (``"topic/partition" -> offset``;
        what an earlier batch still owed there is gone with the old log)."""
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
                if back and key in back:
                    lo = back[key]
                    resume.pop(key, None)
                if hi <= lo:
                    continue
                if key in resume and (topic, int(p)) in late:
                    continue  # owed, but its leader still does not answer: keep owing
                ranges.append((topic, int(p), lo, int(hi)))
        _write(self.dir / "plans" / f"{digest}.json", {"start": start, "end": end, "ranges": ranges, "resume": resume})
        _write(self.dir / "plans" / "by-end" / f"{offsets_digest(end)}.json", {"start_digest": digest})
        self._keep_reads(plan_id(start, end))  # the batch before's are in this plan's resume now
        return ranges, resume

    def forget_reads(self, plan: str) -> None:
        """Start batch ``plan``'s reads afresh: a replay after a restart (the run before it
        never committed) decides again; call once per run of the batch, before its tasks."""
        shutil.rmtree(self.dir / "reads" / plan, ignore_errors=True)

    def _keep_reads(self, plan: str) -> None:
        """Remove every batch's ``reads`` files but ``plan``'s."""
        folder = self.dir / "reads"
        if folder.is_dir():
            for d in folder.iterdir():
                if d.name != plan:
                    shutil.rmtree(d, ignore_errors=True)

    def _short_path(self, r: Range) -> Path:
        """Where versions before the ``reads`` files recorded a short read of ``r``."""
        topic, partition, start, end = r
        return self.dir / "short" / f"{topic}-{partition}-{start}-{end}.json"

    def owed(self, start: Offsets) -> dict[str, int]:
        """What the batch that ended at ``start`` left unread, and what it still owed itself
        (``"topic/partition" -> offset``): the next batch reads it from there."""
        return self._owed(start)

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
        prev_plan = plan_id(prev["start"], prev["end"])
        for r in prev["ranges"]:
            upto = self.decided(prev_plan, tuple(r))  # type: ignore[arg-type]
            if upto is None:  # not decided: a checkpoint of an earlier version (its short reads)
                short = _read(self._short_path(tuple(r)))  # type: ignore[arg-type]
                upto = int(short["upto"]) if isinstance(short, dict) else None
            if upto is not None and upto < r[3]:
                owed[f"{r[0]}/{r[1]}"] = upto
        return owed

    def tidy(self, keep: int = _KEEP_PLANS, keep_short_s: float = _KEEP_SHORT_S) -> None:
        """Forget all but the newest ``keep`` plans (and their links by end), and earlier
        versions' short reads older than ``keep_short_s`` (committed long ago)."""
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
