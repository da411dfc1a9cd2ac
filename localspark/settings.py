"""Settings of ``isrwatch local-spark``."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.settings import option, positive

__all__ = ["LocalSparkSettings"]


@dataclass(frozen=True)
class LocalSparkSettings:
    workers: int = option(2, "number of workers", check=positive)
    cores_per_worker: int = option(1, "cores each worker offers to executors", check=positive)
    worker_memory_mb: int = option(1536, "memory each worker offers to executors", check=positive, metavar="MB")
    data_dir: str | None = option(
        None, "where the master and workers keep logs and work (default: a temporary directory)", metavar="DIR"
    )
