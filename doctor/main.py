"""``isrwatch doctor``: run the checks, print one table (or JSON), exit 0 only when none failed."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

from doctor.checks import FAIL, Row, run_checks, summary
from doctor.settings import DoctorSettings

__all__ = ["main", "render_table"]


def render_table(rows: list[Row]) -> str:
    headers = ("CHECK", "STATUS", "FOUND", "WHAT TO DO")
    cells = [headers, *[(r.check, r.status.upper(), r.found, r.fix) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    lines = []
    for c in cells:
        lines.append("  ".join(c[i].ljust(widths[i]) for i in range(3)) + ("  " + c[3] if c[3] else ""))
    return "\n".join(line.rstrip() for line in lines)


def main(settings: DoctorSettings, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    # The table says what failed; the Kafka clients' own connection errors would only repeat it.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    started = time.monotonic()
    rows = run_checks(settings)
    ok = summary(rows)
    if settings.format == "json":
        json.dump(
            {"ok": ok, "seconds": round(time.monotonic() - started, 1), "checks": [r.as_dict() for r in rows]},
            out,
            indent=1,
        )
        out.write("\n")
    else:
        out.write(render_table(rows) + "\n")
        failed = [r.check for r in rows if r.status == FAIL]
        out.write(
            f"\n{'all is well' if ok else f'{len(failed)} failed: ' + ', '.join(failed)} "
            f"({time.monotonic() - started:.1f} s)\n"
        )
    return 0 if ok else 1
