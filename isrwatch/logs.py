"""Logging set-up: key=value messages on stderr (stdout carries alert JSON)."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging", "kv"]


def kv(**fields: object) -> str:
    """Format fields as ``key=value`` pairs, floats to 3 significant places."""
    parts = []
    for k, v in fields.items():
        if isinstance(v, float):
            v = f"{v:.3g}"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Py4J and Spark's Python side are chatty at INFO.
    for noisy in ("py4j", "py4j.clientserver", "kafka", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
