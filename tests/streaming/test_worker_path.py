"""streaming.worker_path: the jars without Python leave a Spark worker's import path."""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path

import pytest

from streaming.worker_path import drop_archives_without_python


def _jar(path: Path, names: list[str]) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, "x = 1\n" if name.endswith(".py") else b"\0")
    return str(path)


def test_a_jar_without_python_leaves_the_path_and_the_importer_cache(tmp_path, monkeypatch) -> None:
    classes = _jar(tmp_path / "core.jar", [f"org/apache/C{i}.class" for i in range(50)])
    modules = _jar(tmp_path / "with-python.jar", ["shipped_mod_for_worker_path_test.py"])
    monkeypatch.setattr(sys, "path", [*sys.path, classes, modules])
    importlib.invalidate_caches()
    with pytest.raises(ModuleNotFoundError):  # looked for along the whole path: importers made for both jars
        importlib.import_module("no_such_module_for_worker_path_test")
    assert classes in sys.path_importer_cache
    dropped = drop_archives_without_python()
    assert dropped == [classes]
    assert classes not in sys.path and classes not in sys.path_importer_cache
    assert modules in sys.path  # it holds a module: kept, and still importable
    assert importlib.import_module("shipped_mod_for_worker_path_test").x == 1
    sys.path_importer_cache.pop(modules, None)
    sys.modules.pop("shipped_mod_for_worker_path_test", None)


def test_an_unreadable_jar_is_left_alone(tmp_path, monkeypatch) -> None:
    broken = tmp_path / "broken.jar"
    broken.write_bytes(b"not a zip")
    monkeypatch.setattr(sys, "path", [*sys.path, str(broken)])
    assert drop_archives_without_python() == []
    assert str(broken) in sys.path


def test_a_spark_worker_reading_telemetry_has_no_jar_without_python_on_its_path(spark) -> None:
    """Real Spark (local mode): a Python worker's import path once it has loaded the
    sources' module, asked from inside tasks; Spark's own PYTHONPATH for the worker, the
    control, names its core jar."""

    def worker_path(_: object) -> tuple[list[str], list[str]]:
        import os
        import sys

        import streaming.source_spool  # noqa: F401 - what a worker reading telemetry loads

        given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p.endswith(".jar")]
        return given, [p for p in sys.path if p.endswith(".jar")]

    seen = spark.sparkContext.parallelize(range(4), 4).map(worker_path).collect()
    assert all(given for given, _ in seen), f"Spark no longer puts a jar on the workers' path: {seen}"
    assert all(not left for _, left in seen), seen
