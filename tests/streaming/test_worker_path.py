"""streaming.sources.worker_path: a zip on the import path is read again only when it changed."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport
from pathlib import Path

import pytest

from streaming.sources.worker_path import quiet_zip_invalidation

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 reads zip directories lazily itself")


def _zip(path: Path, modules: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in modules.items():
            z.writestr(f"{name}.py", text)
    return str(path)


def _reads(monkeypatch) -> list[str]:
    """Every archive directory zipimport reads from now on."""
    reads: list[str] = []
    original = zipimport._read_directory  # type: ignore[attr-defined]

    def counting(archive: str):  # type: ignore[no-untyped-def]
        reads.append(archive)
        return original(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    return reads


def test_an_unchanged_zip_is_read_once_and_a_rewritten_one_again(tmp_path, monkeypatch) -> None:
    assert quiet_zip_invalidation()
    archive = _zip(tmp_path / "mods.zip", {"zipmod_a_for_worker_path": "x = 1\n"})
    monkeypatch.setattr(sys, "path", [archive, *sys.path])
    assert importlib.import_module("zipmod_a_for_worker_path").x == 1
    reads = _reads(monkeypatch)
    for _ in range(5):
        importlib.invalidate_caches()
    assert reads.count(archive) <= 1  # the importer's first invalidation after the install, then none
    # rewritten in place (another size): the next invalidation reads it, and the new module is found
    _zip(tmp_path / "mods.zip", {"zipmod_a_for_worker_path": "x = 1\n", "zipmod_b_for_worker_path": "y = 22\n"})
    before = reads.count(archive)
    importlib.invalidate_caches()
    assert reads.count(archive) == before + 1
    assert importlib.import_module("zipmod_b_for_worker_path").y == 22
    for name in ("zipmod_a_for_worker_path", "zipmod_b_for_worker_path"):
        sys.modules.pop(name, None)
    sys.path_importer_cache.pop(archive, None)


def test_a_spark_worker_reading_telemetry_reads_no_zip_directory_at_a_task_start(spark) -> None:
    """Real Spark (local mode): inside tasks on workers that loaded the sources' module,
    what one more ``importlib.invalidate_caches()`` (what a worker does before every task)
    reads. Without ``quiet_zip_invalidation`` each call reads every zip importer's archive."""

    def reads_at_invalidation(_: object) -> tuple[int, int]:
        import importlib
        import sys
        import zipimport

        import streaming.sources.source_spool  # noqa: F401 - what a worker reading telemetry loads

        importlib.invalidate_caches()  # each importer's one read after the install
        reads: list[str] = []
        original = zipimport._read_directory

        def counting(archive):  # type: ignore[no-untyped-def]
            reads.append(archive)
            return original(archive)

        zipimport._read_directory = counting
        try:
            importlib.invalidate_caches()
        finally:
            zipimport._read_directory = original
        importers = sum(type(f).__name__ == "zipimporter" for f in sys.path_importer_cache.values())
        return len(reads), importers

    seen = spark.sparkContext.parallelize(range(4), 4).map(reads_at_invalidation).collect()
    assert all(importers > 0 for _, importers in seen), f"no zip on the workers' path: {seen}"
    assert all(reads == 0 for reads, _ in seen), seen
