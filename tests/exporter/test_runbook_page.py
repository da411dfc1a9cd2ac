"""``/runbook``: the runbook the alerts link to, served by isrwatch's own HTTP server
(issue 18), and where the job's alerts point by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import requests

from exporter.runbook import anchor, render_markdown, runbook_html
from exporter.server import serve
from exporter.store import StatusStore
from isrwatch.alerts import AlertName
from streaming.driver.endpoints import runbook_base
from streaming.settings import AlertingSettings, JobSettings

ROOT = Path(__file__).resolve().parents[2]


def test_every_alert_has_its_anchor_in_the_served_page() -> None:
    store = StatusStore()
    with serve(store, "127.0.0.1", 0) as server:
        page = requests.get(f"http://127.0.0.1:{server.port}/runbook", timeout=10)
        missing = requests.get(f"http://127.0.0.1:{server.port}/nothing", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    for name in AlertName:
        assert f'<h2 id="{name.value.lower()}">' in page.text, name
    assert missing.status_code == 404 and "/runbook" in missing.text
    assert runbook_html() is not None and page.content == runbook_html()


def test_markdown_is_escaped_and_its_parts_rendered() -> None:
    page = render_markdown(
        "# Title <x>\n\nText with `code <b>` and **bold** and [a link](https://example.test/a?b=1&c=2).\n\n"
        "* one\n  continued\n* two\n\n| a | b |\n|---|---|\n| 1 | <2> |\n\n```\nkafka-topics.sh --describe <t>\n```\n"
        "See [the rule](rule.md#gaps).\n"
    )
    assert '<h1 id="title-x">Title &lt;x&gt;</h1>' in page
    assert "<code>code &lt;b&gt;</code>" in page and "<strong>bold</strong>" in page
    assert '<a href="https://example.test/a?b=1&amp;c=2">a link</a>' in page
    assert "<li>one continued</li><li>two</li>" in page
    assert "<td>&lt;2&gt;</td>" in page and "<th>a</th>" in page
    assert "<pre><code>kafka-topics.sh --describe &lt;t&gt;</code></pre>" in page
    assert "the rule (docs/rule.md)" in page  # another docs page: named, not a dead link
    assert "<x>" not in page and "<b>" not in page


def test_anchor_matches_what_the_alerts_link_to() -> None:
    assert anchor("KafkaReplicaOutOfSync") == "kafkareplicaoutofsync"
    assert anchor("What to check, first") == "what-to-check-first"


def test_the_job_links_its_own_runbook_unless_told_otherwise() -> None:
    none, job = AlertingSettings(), JobSettings()
    assert runbook_base(none, job, 9743) == "http://127.0.0.1:9743/runbook"
    wiki = AlertingSettings(runbook_url="https://wiki.example/isr")
    assert runbook_base(wiki, job, 9743) == "https://wiki.example/isr"
    assert runbook_base(none, JobSettings(metrics_host="::1"), 9744) == "http://[::1]:9744/runbook"
    wide = runbook_base(none, JobSettings(metrics_host="0.0.0.0"), 9744)
    assert wide is not None and wide.endswith(":9744/runbook") and "0.0.0.0" not in wide


def test_without_its_own_server_the_job_links_only_a_runbook_it_is_given() -> None:
    job = JobSettings(metrics_port=0)
    assert runbook_base(AlertingSettings(), job, None) is None  # no link rather than one to nowhere
    exporter = AlertingSettings(runbook_url="http://exporter:9743/runbook")
    assert runbook_base(exporter, job, None) == "http://exporter:9743/runbook"


def test_an_installed_exporter_serves_the_runbook_from_any_working_directory(tmp_path: Path) -> None:
    """The exporter as setuptools installs it (its modules and the package data pyproject.toml
    declares, links followed), imported with the working directory elsewhere: /runbook's page."""
    source = ROOT / "exporter"
    installed = tmp_path / "site" / "exporter"
    installed.mkdir(parents=True)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in [*source.glob("*.py"), *(p for pattern in data.get("exporter", []) for p in source.glob(pattern))]:
        shutil.copyfile(path, installed / path.relative_to(source))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = "import exporter.runbook as r; print(r.__file__); print(r.runbook_html() is not None)"
    env = {**os.environ, "PYTHONPATH": str(installed.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == [str(installed / "runbook.py"), "True"], out.stderr
