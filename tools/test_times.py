"""Where ``make test``'s time went: each test module's total from the JUnit XML it writes.

``make test`` writes ``.cache/make-test.xml`` (pytest's ``--junitxml``): one ``testcase``
per test with its ``time`` (set-up, call and tear-down). This prints the modules, slowest
first, with their tests' count, their total and their share of the run, then the run's total.

Usage: ``python tools/test_times.py [FILE] [--top N]`` (default ``.cache/make-test.xml``, 25).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

__all__ = ["module_times", "main"]


def module_times(xml_text: str) -> list[tuple[str, int, float]]:
    """(module, tests, seconds) of every module in the report, slowest first."""
    totals: dict[str, list[float]] = defaultdict(list)
    for case in ET.fromstring(xml_text).iter("testcase"):
        module = case.get("classname") or "?"  # the module, or module.Class for a test class
        totals[module].append(float(case.get("time") or 0.0))
    return sorted(((m, len(ts), sum(ts)) for m, ts in totals.items()), key=lambda r: (-r[2], r[0]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=".cache/make-test.xml")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    path = Path(args.file)
    if not path.is_file():
        print(f"no report at {path}: run make test first", file=sys.stderr)
        return 1
    rows = module_times(path.read_text())
    total = sum(s for _, _, s in rows) or 1.0
    for module, n, s in rows[: args.top]:
        print(f"{s:8.1f} s  {100 * s / total:5.1f} %  {n:4d} tests  {module}")
    print(f"{total:8.1f} s  in {sum(n for _, n, _ in rows)} tests, {len(rows)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
