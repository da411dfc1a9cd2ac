"""docs/architecture.md is true to the tree: every module of the packages is listed,
and every path the page names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("isrwatch", "collector", "streaming", "exporter", "simulator", "localkafka", "doctor")


def _section(package: str) -> str:
    m = re.search(rf"^\* \*\*{package}/\*\*(.*?)(?=^\* |\Z)", DOC, re.S | re.M)
    assert m, f"docs/architecture.md has no entry for {package}/"
    return m.group(1)


def test_every_module_is_listed_under_its_package() -> None:
    for package in PACKAGES:
        listed = set(re.findall(r"`([a-z_]+\.py)`", _section(package)))
        modules = {p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
        assert modules == listed, (
            f"{package}/: not on the page {sorted(modules - listed)}, gone {sorted(listed - modules)}"
        )


def test_every_path_the_page_names_exists() -> None:
    paths = set(
        re.findall(
            r"\b((?:isrwatch|collector|streaming|exporter|simulator|localkafka|doctor|tests|deploy|docs)/[\w./-]+\.(?:py|md|json|yml))",
            DOC,
        )
    )
    assert paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing
