"""An append-only telemetry log on local disk: the embedded default's "topic".

The simulator appends telemetry records; the streaming job's spool source
reads them by offset (record index), so Spark can checkpoint offsets and
re-read a range after a restart, as it does with Kafka. Each flush writes one
segment file ``<start>-<end>.jsonl`` (records start..end-1, one per line)
atomically (temporary name, then rename), so a reader never sees half a
segment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["SpoolWriter", "SpoolReader"]

_SUFFIX = ".jsonl"


def _segments(path: Path) -> list[tuple[int, int, Path]]:
    out = []
    for p in path.glob(f"*{_SUFFIX}"):
        start, _, end = p.stem.partition("-")
        if start.isdigit() and end.isdigit():
            out.append((int(start), int(end), p))
    out.sort()
    return out


class SpoolWriter:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        segs = _segments(self.path)
        self.end = segs[-1][1] if segs else 0

    def append(self, records: Sequence[bytes]) -> int:
        """Write records as one segment; returns the new end offset."""
        if not records:
            return self.end
        for r in records:
            if b"\n" in r:
                raise ValueError("a spool record must not contain a newline")
        start, end = self.end, self.end + len(records)
        final = self.path / f"{start:012d}-{end:012d}{_SUFFIX}"
        tmp = self.path / f".{final.name}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(b"\n".join(records) + b"\n")
        os.replace(tmp, final)
        self.end = end
        return end


class SpoolReader:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def end_offset(self) -> int:
        segs = _segments(self.path) if self.path.exists() else []
        return segs[-1][1] if segs else 0

    def read(self, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Yield (offset, record) for offsets in [start, end)."""
        for seg_start, seg_end, p in _segments(self.path):
            if seg_end <= start or seg_start >= end:
                continue
            with open(p, "rb") as fh:
                for i, line in enumerate(fh, seg_start):
                    if i >= end:
                        break
                    if i >= start:
                        yield i, line.rstrip(b"\n")
