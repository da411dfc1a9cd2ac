"""The runbook (``docs/runbook.md``) as one HTML page, for ``/runbook``.

Alerts link to ``…/runbook#<alertname in lower case>``; an operator paged at
night needs that link to open without a public site, so the job's and the
exporter's HTTP servers serve the page themselves. The renderer knows the
Markdown the runbook uses (headings, paragraphs, lists, tables, fenced code,
inline code, bold, links) and escapes everything else.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path

__all__ = ["RUNBOOK_PATH", "anchor", "render_markdown", "runbook_html"]

# docs/runbook.md, through the package's link to it: package data, so an installed isrwatch has it
RUNBOOK_PATH = Path(__file__).with_name("runbook.md")

_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """The anchor of a heading: lower case, spaces to dashes, other punctuation dropped
    (``KafkaReplicaOutOfSync`` -> ``kafkareplicaoutofsync``, as the alerts link)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _inline(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        code, bold, label, url = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{_inline(bold)}</strong>")
        else:
            if url.endswith(".md") or ".md#" in url:  # another page of docs/: not served, say where
                out.append(f"{_inline(label)} (docs/{html.escape(url.split('#')[0])})")
            else:
                out.append(f'<a href="{html.escape(url, quote=True)}">{_inline(label)}</a>')
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def render_markdown(text: str, title: str = "isrwatch runbook") -> str:
    """A whole HTML page for ``text``."""
    body: list[str] = []
    lines = text.splitlines()
    i = 0
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            body.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            i += 1
            code = []
            while i < len(lines) and not lines[i].strip().startswith("```"):
                code.append(lines[i])
                i += 1
            body.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
        elif m := re.match(r"(#{1,4})\s+(.*)", stripped):
            flush()
            level, heading = len(m[1]), m[2]
            body.append(f'<h{level} id="{anchor(heading)}">{_inline(heading)}</h{level}>')
        elif stripped.startswith(("* ", "- ")):
            flush()
            items = []
            while i < len(lines) and lines[i].strip().startswith(("* ", "- ")):
                item = [lines[i].strip()[2:]]
                while i + 1 < len(lines) and lines[i + 1].startswith("  ") and lines[i + 1].strip():
                    i += 1
                    item.append(lines[i].strip())
                items.append(f"<li>{_inline(' '.join(item))}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif stripped.startswith("|"):
            flush()
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            head, rest = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
            body.append(
                "<table><tr>"
                + "".join(f"<th>{_inline(c)}</th>" for c in head)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rest)
                + "</table>"
            )
            continue
        elif not stripped:
            flush()
        else:
            paragraph.append(stripped)
        i += 1
    flush()
    style = (
        "body{font-family:sans-serif;max-width:52em;margin:2em auto;line-height:1.45;padding:0 1em}"
        "code{background:#f3f3f3;padding:0 .2em}pre{background:#f3f3f3;padding:.6em;overflow-x:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em}"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


@lru_cache(maxsize=1)
def runbook_html() -> bytes | None:
    """The rendered runbook, or None when ``runbook.md`` is not installed beside the code."""
    try:
        return render_markdown(RUNBOOK_PATH.read_text(encoding="utf-8")).encode()
    except OSError:
        return None
