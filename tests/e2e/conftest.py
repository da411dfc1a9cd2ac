"""Fixtures of the e2e tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def spark_reader():
    """A local Spark session of the test's own, started only when the jobs are done."""
    made = []

    def make():
        from streaming.lifecycle.session import build_session

        made.append(build_session("local[1]", 2, app_name="isrwatch-e2e-reader"))
        return made[-1]

    yield make
    for s in made:
        s.stop()
