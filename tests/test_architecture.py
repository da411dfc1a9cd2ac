"""docs/architecture.md is true to the tree: every module of the packages is listed,
and every path the page names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = (
    "isrwatch",
    "collector",
    "streaming",
    "exporter",
    "simulator",
    "localkafka",
    "localservices",
    "localspark",
    "doctor",
    "replay",
)


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
            r"\b((?:isrwatch|collector|streaming|exporter|simulator|localkafka|localservices|localspark|doctor|replay|tests|deploy|docs)/[\w./-]+\.(?:py|md|json|yml))",
            DOC,
        )
    )
    assert paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


# -- components depend only downward ------------------------------------------------------

PRODUCTION = (
    "isrwatch", "collector", "streaming", "exporter", "simulator", "localkafka", "localservices", "localspark", "doctor",
    "replay",
)  # fmt: skip
# isrwatch/ is the core every component uses; these of its modules are the command line,
# which composes the components (and so imports them).
CLI_MODULES = {"isrwatch/cli.py", "isrwatch/commands.py", "isrwatch/reference.py", "isrwatch/__main__.py"}
# Who may import whom, beyond the core and itself (a module not listed for a package may not).
ALLOWED = {
    "collector": set(),
    "simulator": set(),
    "localkafka": set(),
    "localservices": {"localkafka"},  # free ports
    "localspark": {"localkafka"},  # free ports, the JVM process handling
    "exporter": set(),
    "streaming": {"exporter", "simulator"},  # it serves the exporter's /metrics; simulator: see below
    "doctor": {"streaming", "collector", "exporter", "simulator"},  # it checks what the job would use
    "replay": {"streaming", "simulator"},  # the job's own evaluation; simulator: --simulate, see below
}
# The embedded simulator is demo wiring: the job reaches it through streaming/feeder.py only.
SIMULATOR_WIRING = {"streaming/feeder.py", "replay/settings.py", "replay/sources.py"}


def _imports(path: Path) -> set[str]:
    """Top-level packages ``path`` imports at run time (imports only for type checking are left out)."""
    import ast

    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_components_depend_only_downward() -> None:
    wrong = []
    for package in PRODUCTION:
        for path in sorted((ROOT / package).glob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in CLI_MODULES:
                continue
            own = {package, "isrwatch"} if package != "isrwatch" else {"isrwatch"}
            allowed = own | ALLOWED.get(package, set())
            if rel not in SIMULATOR_WIRING and package != "simulator":
                allowed -= {"simulator"}
            for imported in _imports(path) & (set(PRODUCTION) | {"tests", "bench", "tools"}):
                if imported not in allowed:
                    wrong.append(f"{rel} imports {imported}")
    assert not wrong, wrong


def test_the_layer_check_sees_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import doctor\nfrom streaming import job\n"
    )
    assert _imports(bad) == {"typing", "streaming"}
