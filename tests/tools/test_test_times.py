"""tools/test_times.py: module totals from a JUnit report as pytest writes it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from test_times import main, module_times  # noqa: E402

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_restart" name="test_a" time="149.3" />
<testcase classname="tests.isrwatch.test_rule" name="test_b" time="0.5" />
<testcase classname="tests.isrwatch.test_rule" name="test_c[1]" time="0.25"><skipped /></testcase>
<testcase classname="tests.e2e.test_two_clusters" name="test_d" time="284.4" />
</testsuite></testsuites>
"""


def test_modules_are_summed_and_ordered_slowest_first():
    assert module_times(REPORT) == [
        ("tests.e2e.test_two_clusters", 1, 284.4),
        ("tests.e2e.test_restart", 1, 149.3),
        ("tests.isrwatch.test_rule", 2, 0.75),
    ]


def test_the_printout_ends_with_the_run_s_total(tmp_path, capsys):
    f = tmp_path / "r.xml"
    f.write_text(REPORT)
    assert main([str(f), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "tests.e2e.test_two_clusters" in lines[0]
    assert lines[-1].split()[0] == "434.4" and "in 4 tests, 3 modules" in lines[-1]


def test_a_missing_report_says_so(tmp_path, capsys):
    assert main([str(tmp_path / "none.xml")]) == 1
    assert "run make test first" in capsys.readouterr().err
