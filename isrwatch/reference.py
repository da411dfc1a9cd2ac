"""docs/configuration.md, made from the settings dataclasses.

``python -m isrwatch.reference > docs/configuration.md`` rewrites it; a test
checks the file matches the code, so the reference is never out of date.
"""

from __future__ import annotations

import importlib

from isrwatch.cli import COMMANDS
from isrwatch.settings import describe

__all__ = ["render"]


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Every option of every command, made from the code (`python -m isrwatch.reference`).",
        "Layers, later wins: the default, a TOML file given with `--config FILE` (keys as in the",
        "*name* column; an unknown key is an error), the environment variable, the flag.",
        "List options take a comma-separated list in the environment and repeat as flags.",
        "Every value is checked at start-up: a bad one stops the command with one line naming",
        "where it was set (the flag, the environment variable, or the file and its key).",
        "A command whose work spans components takes each component's settings (the *declared in*",
        "column; `isrwatch.commands` composes them), with flat names.",
        "",
    ]
    for command, (text, settings_path, _) in COMMANDS.items():
        module, _, name = settings_path.partition(":")
        cls = getattr(importlib.import_module(module), name)
        lines += [f"## `isrwatch {command}`", "", text[0].upper() + text[1:] + ".", ""]
        lines += ["| name | flag | environment | default | meaning | declared in |", "|---|---|---|---|---|---|"]
        for row in describe(cls):
            default = f"`{row['default']}`" if row["default"] not in ("", "[]") else ""
            meaning = row["help"].replace("|", "\\|")
            lines.append(
                f"| {row['name']} | `{row['flag']}` | `{row['env']}` | {default} | {meaning} | `{row['declared_by']}` |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
