"""A SparkSession shared by the streaming tests (local mode, started once)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from streaming.session import build_session

    session = build_session("local[2]", 2, app_name="isrwatch-tests")
    yield session
    session.stop()
