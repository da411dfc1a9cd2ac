"""``isrwatch replay --report DIR``: one HTML page with the replay's charts.

Self-contained (inline SVG, no script, no font or file from elsewhere), so it opens from
disk in any browser with no server:

* followers out of the ISR over the recording, one line per setting;
* shrinks, flaps and expands per setting (bars);
* the warning each shrink would have had: the median seconds from the follower nearing the
  lag to its shrink, per setting;
* the table of the terminal output.
"""

from __future__ import annotations

import html
import os
from typing import Any

__all__ = ["write_report", "COLORS"]

# One colour per setting, in order (distinct from the page's black, greys and white).
COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_W, _H, _PAD = 760, 260, 48


def _name(s: dict[str, Any]) -> str:
    lag = "recorded" if s["lag_time_max_ms"] is None else f"{s['lag_time_max_ms']} ms"
    messages = f", {s['lag_max_messages']} msgs" if s["lag_max_messages"] is not None else ""
    return f"{s['rule']} ({lag}{messages})"


def _legend(settings: list[dict[str, Any]], y: int) -> str:
    items = []
    for i, s in enumerate(settings):
        x = _PAD + (i % 3) * 240
        row = y + (i // 3) * 16
        color = COLORS[i % len(COLORS)]
        items.append(
            f'<rect x="{x}" y="{row - 9}" width="12" height="10" fill="{color}"/>'
            f'<text x="{x + 16}" y="{row}" font-size="11">{html.escape(_name(s))}</text>'
        )
    return "".join(items)


def _axes(y_max: float, x_label: str, y_label: str) -> str:
    bottom, right = _H - _PAD, _W - 16
    ticks = "".join(
        f'<line x1="{_PAD}" x2="{right}" y1="{bottom - f * (bottom - 16)}" y2="{bottom - f * (bottom - 16)}" '
        f'stroke="#ddd"/><text x="{_PAD - 6}" y="{bottom - f * (bottom - 16) + 4}" font-size="10" '
        f'text-anchor="end">{y_max * f:g}</text>'
        for f in (0, 0.5, 1)
    )
    return (
        ticks
        + f'<line x1="{_PAD}" y1="16" x2="{_PAD}" y2="{bottom}" stroke="#333"/>'
        + f'<line x1="{_PAD}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>'
        + f'<text x="{(_PAD + right) / 2}" y="{_H - 22}" font-size="11" text-anchor="middle">{x_label}</text>'
        + f'<text x="12" y="{_H / 2}" font-size="11" transform="rotate(-90 12 {_H / 2})" '
        f'text-anchor="middle">{y_label}</text>'
    )


def _out_over_time(result: dict[str, Any]) -> str:
    start, end = result["start_ms"], max(result["end_ms"], result["start_ms"] + 1)
    peak = max([n for series in result["series"] for _, n in series] + [1])
    bottom, right = _H - _PAD, _W - 16

    def x(t: int) -> float:
        return _PAD + (t - start) / (end - start) * (right - _PAD)

    def y(n: int) -> float:
        return bottom - n / peak * (bottom - 16)

    lines = []
    for i, series in enumerate(result["series"]):
        points, level = [(x(start), y(0))], 0
        for t, n in series:
            points += [(x(t), y(level)), (x(t), y(n))]
            level = n
        points.append((x(end), y(level)))
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        lines.append(
            f'<polyline points="{path}" fill="none" stroke="{COLORS[i % len(COLORS)]}" stroke-width="2.5" '
            f'data-setting="{i}"/>'
        )
    span_s = (end - start) / 1000
    legend = _legend(result["settings"], _H + 14)
    rows = (len(result["settings"]) + 2) // 3
    return (
        f'<svg class="chart" id="out-over-time" width="{_W}" height="{_H + 16 * rows + 8}" '
        f'xmlns="http://www.w3.org/2000/svg">'
        + _axes(peak, f"seconds into the recording (0 .. {span_s:.0f})", "followers out of the ISR")
        + "".join(lines)
        + legend
        + "</svg>"
    )


def _bars(result: dict[str, Any], chart_id: str, fields: list[tuple[str, str]], y_label: str) -> str:
    settings = result["settings"]
    values = [[float(s[f] or 0) for f, _ in fields] for s in settings]
    peak = max([v for vs in values for v in vs] + [1])
    bottom, right = _H - _PAD, _W - 16
    group_w = (right - _PAD) / max(1, len(settings))
    bar_w = group_w * 0.8 / len(fields)
    bars = []
    for i, vs in enumerate(values):
        for j, v in enumerate(vs):
            h = v / peak * (bottom - 16)
            bx = _PAD + i * group_w + group_w * 0.1 + j * bar_w
            opacity = 1.0 - 0.35 * j
            bars.append(
                f'<rect x="{bx:.1f}" y="{bottom - h:.1f}" width="{bar_w * 0.9:.1f}" height="{h:.1f}" '
                f'fill="{COLORS[i % len(COLORS)]}" fill-opacity="{opacity:.2f}" data-setting="{i}">'
                f"<title>{html.escape(_name(settings[i]))}: {fields[j][1]} {v:g}</title></rect>"
            )
    key = " / ".join(label for _, label in fields)
    rows = (len(settings) + 2) // 3
    return (
        f'<svg class="chart" id="{chart_id}" width="{_W}" height="{_H + 16 * rows + 8}" '
        f'xmlns="http://www.w3.org/2000/svg">'
        + _axes(peak, f"per setting: {key} (fainter to the right)", y_label)
        + "".join(bars)
        + _legend(settings, _H + 14)
        + "</svg>"
    )


def _table(result: dict[str, Any]) -> str:
    head = ["setting", "shrinks", "expands", "flaps", "replica-s out", "partitions < min.isr", "warned",
            "median warning (s)", "longest a follower came back from (s)"]  # fmt: skip
    rows = []
    for s in result["settings"]:
        longest = s.get("longest_recovered")
        cells = [_name(s), s["shrinks"], s["expands"], s["flaps"], s["replica_seconds_out_of_isr"],
                 s["partitions_under_min_isr"], s["shrinks_warned"],
                 "-" if s["warning_lead_s_median"] is None else s["warning_lead_s_median"],
                 f"{longest['seconds']:.1f}" if longest else "-"]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def write_report(result: dict[str, Any], directory: str) -> str:
    """Write ``directory/index.html`` for a ``replay.main.replay`` result; its path."""
    os.makedirs(directory, exist_ok=True)
    span_s = (result["end_ms"] - result["start_ms"]) / 1000
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>isrwatch replay</title>
<style>body{{font-family:sans-serif;margin:24px;color:#111}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}h2{{font-size:16px;margin-top:28px}}</style>
</head><body>
<h1>isrwatch replay</h1>
<p>{result["records"]} records, {result["observations"]} observations over {span_s:.0f} s;
{result["rejected_records"]} records and {result["rejected_observations"]} observations rejected.</p>
<h2>Followers out of the ISR over time</h2>
{_out_over_time(result)}
<h2>Shrinks, flaps and expands per setting</h2>
{_bars(result, "shrinks-flaps", [("shrinks", "shrinks"), ("flaps", "flaps"), ("expands", "expands")], "count")}
<h2>Warning before each shrink (median seconds from nearing the lag to the shrink)</h2>
{_bars(result, "warning-lead", [("warning_lead_s_median", "median warning")], "seconds")}
<p>No bar: the setting dropped no follower, or dropped them with no warning at all (the message
rule on a burst: a follower goes from in sync to out at one round).</p>
<h2>Per setting</h2>
{_table(result)}
<p>Caveats: seen at the telemetry's rounds; the recorded brokers' own ISR is left out of each
setting's verdict; a leader checks its followers every replica.lag.time.max.ms (up to 0.10.1)
or half of it, so a broker may keep a follower up to one check longer (docs/replay.md).</p>
</body></html>
"""
    path = os.path.join(directory, "index.html")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path
