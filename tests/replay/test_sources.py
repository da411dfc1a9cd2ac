"""replay.sources: a spool directory and a line file give back the records written."""

from __future__ import annotations

from pathlib import Path

import pytest

from isrwatch.exceptions import ConfigError
from isrwatch.spool import SpoolWriter
from replay.sources import read_recording

RECORDS = [b'{"version": 1}', b"\xff\x00 any bytes", b"{}"]


def test_a_spool_directory_in_its_order(tmp_path: Path) -> None:
    spool = SpoolWriter(tmp_path / "spool")
    spool.append(RECORDS[:2])
    spool.append(RECORDS[2:])
    assert list(read_recording(str(tmp_path / "spool"))) == RECORDS


def test_a_line_file_without_its_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"\n".join([RECORDS[0], b"", RECORDS[1], b"  ", RECORDS[2]]) + b"\r\n")
    assert list(read_recording(str(path))) == RECORDS


def test_a_directory_that_is_not_a_spool_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no spool segments"):
        read_recording(str(tmp_path))
