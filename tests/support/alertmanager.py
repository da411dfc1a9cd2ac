"""The Alertmanager session fixture (``localservices.Alertmanager``).

Use it from a test module or conftest::

    from tests.support.alertmanager import alertmanager  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localservices import Alertmanager

__all__ = ["alertmanager"]


@pytest.fixture(scope="session")
def alertmanager() -> Iterator[Alertmanager]:
    """A started Alertmanager shared by the session; use fresh label values
    (e.g. a unique ``cluster``) so tests do not see each other's alerts."""
    with Alertmanager() as am:
        yield am
