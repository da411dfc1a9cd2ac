"""Spark's Python workers: zip archives on the import path read again only when they change.

Before every task a Spark Python worker calls ``importlib.invalidate_caches()`` (PySpark
4.1's ``worker_util.setup_spark_files``). On Python 3.10 and 3.11 that makes every zip
importer read its archive's whole directory again at once (CPython gh-103200, made lazy in
3.12), and a worker has many: ``pyspark.zip`` once per package imported from it, py4j's zip,
and Spark's core jar (5,358 entries, no Python in a pip-installed PySpark), which Spark also
puts on the workers' path. Measured here: 16 zip importers in a worker, 230-380 ms per call
at a load of 6 (the jar ~90 ms of it); py-spy on the soak's job found its Python workers
spending half their time there. Each micro-batch runs one such task per telemetry range.

``quiet_zip_invalidation`` makes a zip importer's ``invalidate_caches`` read its archive
again only when the file changed since that importer last read it (its modification time,
size or inode), which keeps what invalidation is for (a zip rewritten in place is seen again)
and drops the cost. Only on Python before 3.12, in the process that calls it: the sources'
module (``streaming.sources.source_spool``, imported by ``streaming.sources.source_kafka`` too) calls it when
it is loaded, so a worker's tasks after its first are spared (in the job's driver, which loads
it too, nothing changes but the cost of a rare call).
"""

from __future__ import annotations

import os
import sys
import zipimport

__all__ = ["quiet_zip_invalidation"]

_STAMP = "_isrwatch_read_stamp"  # the archive's stat when this importer last read it


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def quiet_zip_invalidation() -> bool:
    """Install the stat-guarded ``invalidate_caches`` on ``zipimport.zipimporter`` (Python
    before 3.12; once per process). -> whether it is installed."""
    if sys.version_info >= (3, 12):
        return False  # lazy already
    current = zipimport.zipimporter.invalidate_caches
    if getattr(current, "_isrwatch", False):
        return True
    reread = current

    def invalidate_caches(self: zipimport.zipimporter) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, _STAMP, None) == stamp:
            return  # unchanged since this importer read it: its directory is current
        reread(self)
        setattr(self, _STAMP, stamp)

    invalidate_caches._isrwatch = True  # type: ignore[attr-defined]
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    return True
