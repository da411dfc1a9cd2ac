"""Spark's Python workers: the Spark core jar off their import path.

Spark puts its core jar on every Python worker's ``PYTHONPATH`` (after ``pyspark.zip`` and
py4j's zip; for deployments that ship PySpark inside the jar). A pip-installed PySpark's jar
holds no Python at all, but it is a zip archive of 5,358 entries, and before every task the
worker calls ``importlib.invalidate_caches()``, which makes Python 3.11's zip importer read
the archive's whole directory again: 40-90 ms of the worker's CPU per task, measured here,
before the task does anything (py-spy on the soak's job: half the Python workers' time).
Each micro-batch runs one such task per telemetry range.

``drop_archives_without_python`` removes such archives from ``sys.path`` and the importer
cache of the process it runs in. The sources' module (``streaming.source_spool``, imported
by ``streaming.source_kafka`` too) calls it when a worker first loads it, so every later task
of that worker skips the reading. An archive that holds Python modules stays.
"""

from __future__ import annotations

import sys
import zipfile

__all__ = ["drop_archives_without_python"]

_ARCHIVES = (".jar",)
_PYTHON = (".py", ".pyc")


def _holds_python(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith(_PYTHON) for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return True  # unreadable: not ours to judge, leave it where it is


def drop_archives_without_python() -> list[str]:
    """Remove the jars on ``sys.path`` that hold no Python module (and their cached
    importers); -> the entries removed."""
    dropped = [p for p in sys.path if p.endswith(_ARCHIVES) and not _holds_python(p)]
    for entry in dropped:
        while entry in sys.path:
            sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
    return dropped
