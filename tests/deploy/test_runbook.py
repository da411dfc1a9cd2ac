"""docs/runbook.md: a section per alert, at the anchor every runbook_url (from
the job's alerts and from the Prometheus rules) points to."""

from __future__ import annotations

import re

import yaml

from isrwatch.alerts import AlertName
from isrwatch.outcomes import PREDICTIONS_MISSING
from tests.deploy.panels import FLAPPING, REPO, RULE_RUNBOOK_URL, RULES_FILE

RUNBOOK = REPO / "docs" / "runbook.md"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def sections() -> dict[str, str]:
    """Anchor of each level-2 heading -> its body."""
    parts = re.split(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)
    return {github_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_a_section_per_alert() -> None:
    found = sections()
    for name in [a.value for a in AlertName] + [PREDICTIONS_MISSING, FLAPPING]:
        anchor = name.lower()
        assert anchor in found, f"no section '## {name}' in docs/runbook.md"
        body = found[anchor].lower()
        for part in ("what it means", "what to check", "what to do"):
            assert f"**{part}.**" in body, f"{name}: no '{part}'"


def test_rule_runbook_urls_point_at_sections() -> None:
    found = sections()
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
    assert len(urls) == len(AlertName) + 2  # and IsrwatchPredictionsMissing, KafkaReplicaFlapping
    for url in urls:
        base, _, anchor = url.rpartition("#")
        assert base == RULE_RUNBOOK_URL  # every rule from the one place
        assert anchor in found, url
    # The one place: a recording rule whose url label is isrwatch's own runbook page.
    recorded = [r for g in groups for r in g["rules"] if r.get("record") == "isrwatch:runbook_url"]
    assert len(recorded) == 1
    url = re.search(r'"url", "([^"]+)"', recorded[0]["expr"])
    assert url and url.group(1).endswith("/runbook"), recorded


def test_internal_links_resolve() -> None:
    found = sections()
    for anchor in re.findall(r"\]\(#([\w-]+)\)", RUNBOOK.read_text()):
        assert anchor in found, anchor
    for target in re.findall(r"\]\(([\w./-]+\.md)\)", RUNBOOK.read_text()):
        assert (RUNBOOK.parent / target).is_file(), target
