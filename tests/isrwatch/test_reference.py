"""docs/configuration.md lists every option as the code declares it."""

from pathlib import Path

from isrwatch.reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_matches_the_code() -> None:
    assert DOC.read_text() == render(), "run: .venv/bin/python -m isrwatch.reference > docs/configuration.md"
