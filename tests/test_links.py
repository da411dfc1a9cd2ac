"""No link to nowhere: no file of the project names an address of a repository that does
not exist (issue 56: alerts linked to one; the runbook is served by isrwatch itself)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Written in two parts, so this file does not name it either.
NOWHERE = ("github.com/" + "isrwatch").encode()
# Not the project's files: the virtualenv, the download cache, git, and the tools' caches.
SKIPPED = {".venv", ".cache", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def files_naming(root: Path, needle: bytes) -> list[str]:
    """The files under ``root`` (not in SKIPPED directories) that contain ``needle``, in any case."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder, name)
            try:
                data = path.read_bytes()
            except OSError:  # a link whose target is gone, a file removed meanwhile
                continue
            if needle.lower() in data.lower():
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def test_no_file_names_a_repository_that_does_not_exist() -> None:
    named = files_naming(ROOT, NOWHERE)
    assert not named, f"these files name {NOWHERE.decode()}, which does not exist: {named}"


def test_the_search_finds_the_address_anywhere_but_in_what_it_skips(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_bytes(b"see https://GitHub.com/" + b"isrwatch/isrwatch/blob/main/x.md")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.py").write_bytes(NOWHERE)
    (tmp_path / "ok.md").write_text("https://github.com/prometheus/client_python")
    assert files_naming(tmp_path, NOWHERE) == ["docs/page.md"]
