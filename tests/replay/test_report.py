"""``isrwatch replay --report``: the page opens from disk in a real headless browser
(Debian's Chromium, installed by ``make install``) and its charts are drawn with the data.

The replay is the simulator's burst scenario under the message rule and the time rule (real
Spark). Chromium's screenshot of the page is read back pixel by pixel: the message rule's
colour must cover far more of it than the time rule's (its line leaves the axis, its bars
stand; the time rule has no shrink, so only its legend and a flat line are drawn), which is
only so when the charts are drawn from the data.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from isrwatch.rule import Rule
from replay.main import Setting, replay
from replay.report import COLORS, write_report
from replay.sources import simulated
from replay.stage import frame
from tests.support.png import read_rgb

pytestmark = pytest.mark.spark


def _count(pixels: list[tuple[int, int, int]], color: str) -> int:
    target = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
    return sum(1 for p in pixels if all(abs(a - b) <= 24 for a, b in zip(p, target, strict=True)))


def test_the_report_opens_in_a_browser_and_draws_the_data(spark, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium: make install installs Debian's package"
    records = list(simulated("burst", 120.0, 1, 200, "poll"))
    settings = [Setting(Rule.LEGACY_MESSAGES, 10_000, 4000), Setting(Rule.KIP16, 10_000, None)]
    result = replay(spark, frame(spark, records), settings, 10_000, top=3)
    assert result["settings"][0]["flaps"] >= 1 and result["settings"][1]["shrinks"] == 0
    page = Path(write_report(result, str(tmp_path / "report")))
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=900,1500",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    width, height, pixels = read_rgb(shot)
    assert (width, height) == (900, 1500)
    message_rule, time_rule = _count(pixels, COLORS[0]), _count(pixels, COLORS[1])
    assert time_rule > 0, "the time rule's legend and line are not drawn"
    assert message_rule > 3000 and message_rule > 3 * time_rule, (message_rule, time_rule)
    text = page.read_text()
    assert "<script" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
