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


def _modules(package: str) -> list[Path]:
    """The package's modules, those of its subpackages included."""
    return sorted((ROOT / package).rglob("*.py"))


def _section(package: str) -> str:
    m = re.search(rf"^\* \*\*{package}/\*\*(.*?)(?=^\* |\Z)", DOC, re.S | re.M)
    assert m, f"docs/architecture.md has no entry for {package}/"
    return m.group(1)


def _listed(section: str) -> set[str]:
    """The modules a package's entry names: `name.py`, and under a sub-entry ``* `sub/`, ...``
    (a subpackage) as sub/name.py."""
    parts = re.split(r"^\s+\* `([a-z_]+)/`", section, flags=re.M)
    listed = set(re.findall(r"`([a-z_]+\.py)`", parts[0]))
    for sub, text in zip(parts[1::2], parts[2::2], strict=True):
        listed |= {f"{sub}/{name}" for name in re.findall(r"`([a-z_]+\.py)`", text)}
    return listed


def test_every_module_is_listed_under_its_package() -> None:
    for package in PACKAGES:
        listed = _listed(_section(package))
        # a subpackage's modules as subpackage/module.py (streaming/'s sources/, evaluation/, ...)
        modules = {p.relative_to(ROOT / package).as_posix() for p in _modules(package) if p.name != "__init__.py"}
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


# -- each package's docstring: what it is for, the page, only modules that exist ------------

# ``name`` (a module of this package or one of its public names), ``package.module`` and
# name.py or package/name.py: how a docstring names a module.
_BACKTICKED = re.compile(r"``([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)``")
_FILE = re.compile(r"(?<![\w./-])(?:([a-z_]+)/)?([a-z_][a-z0-9_]*)\.py\b")


def _package_docstring(package: str) -> str:
    import ast

    return ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""


def _public_names(package: str) -> set[str]:
    import ast

    for node in ast.parse((ROOT / package / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and "__all__" in ast.unparse(node):
            value = node.value
            if isinstance(value, ast.List | ast.Tuple):
                return {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _is_module(package: str, name: str) -> bool:
    return (ROOT / package / f"{name}.py").is_file() or (ROOT / package / name / "__init__.py").is_file()


def _modules_named_but_missing(package: str, doc: str) -> list[str]:
    missing = []
    for name in _BACKTICKED.findall(doc):
        head, _, rest = name.partition(".")
        if rest and head in PACKAGES:  # package.module
            if not _is_module(head, rest.replace(".", "/")):
                missing.append(name)
        elif not rest and not _is_module(package, name) and name not in _public_names(package):
            missing.append(name)
    for owner, name in _FILE.findall(doc):
        if not _is_module(owner or package, name):
            missing.append(f"{owner}/{name}.py" if owner else f"{name}.py")
    return missing


# the packages and their subpackages (streaming/sources, ...), each with its docstring
WITH_SUBPACKAGES = tuple(
    p.parent.relative_to(ROOT).as_posix() for package in PACKAGES for p in _modules(package) if p.name == "__init__.py"
)


def test_package_docstrings_name_only_modules_that_exist() -> None:
    wrong = [
        f"{package}/__init__.py names {name}, which is not a module of {package}/"
        for package in WITH_SUBPACKAGES
        for name in _modules_named_but_missing(package, _package_docstring(package))
    ]
    assert not wrong, wrong


def test_package_docstrings_point_to_the_architecture_page() -> None:
    silent = [package for package in WITH_SUBPACKAGES if "docs/architecture.md" not in _package_docstring(package)]
    assert not silent, f"docstrings of {silent} do not point to docs/architecture.md"


def test_the_docstring_check_sees_a_module_that_is_not_there() -> None:
    doc = "``store`` holds statuses, ``collector`` declares families, ``streaming.lifecycle.query`` and server.py, gone.py"
    assert _modules_named_but_missing("exporter", doc) == ["collector", "gone.py"]
    assert _modules_named_but_missing("exporter", "``StatusStore``, ``render`` and ``isrwatch.nothing``") == [
        "isrwatch.nothing"
    ]


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
# The embedded simulator is demo wiring: the job reaches it through streaming/sources/feeder.py only.
SIMULATOR_WIRING = {"streaming/sources/feeder.py", "replay/settings.py", "replay/sources.py"}


def _runtime_imports(path: Path) -> list[str]:
    """What ``path`` imports at run time, as dotted names (``from a.b import c``: ``a.b.c``);
    imports only for type checking are left out."""
    import ast

    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{a.name}" for a in node.names]
    return found


def _imports(path: Path) -> set[str]:
    """Top-level packages ``path`` imports at run time."""
    return {name.split(".")[0] for name in _runtime_imports(path)}


def test_components_depend_only_downward() -> None:
    wrong = []
    for package in PRODUCTION:
        for path in _modules(package):
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


# -- inside streaming/: a micro-batch's path in one direction ---------------------------------
# Each subpackage imports (at run time) only those after it: the life cycle wires the others;
# the driver reads Spark's rows and writes through the sinks; the sinks write what the
# evaluation's expressions made; the evaluation imports no other part of the job. The sources
# are the life cycle's alone. (streaming/settings.py: every part may read it.)
STREAMING_LAYERS = ("lifecycle", "driver", "sinks", "evaluation")
STREAMING_PARTS = (*STREAMING_LAYERS, "sources")


def _streaming_imports(path: Path) -> set[str]:
    """The parts of streaming/ that ``path`` imports at run time."""
    return {
        parts[1]
        for parts in (name.split(".") for name in _runtime_imports(path))
        if parts[0] == "streaming" and len(parts) > 1 and parts[1] in STREAMING_PARTS
    }


def test_streaming_parts_depend_only_downward() -> None:
    wrong = []
    for path in _modules("streaming"):
        rel = path.relative_to(ROOT / "streaming").parts
        if len(rel) < 2:
            continue  # settings.py, __init__.py
        part = rel[0]
        allowed = {part}
        if part in STREAMING_LAYERS:
            allowed |= set(STREAMING_LAYERS[STREAMING_LAYERS.index(part) :])
        if part == "lifecycle":
            allowed.add("sources")
        for imported in _streaming_imports(path) - allowed:
            wrong.append(f"streaming/{'/'.join(rel)} imports streaming/{imported}")
    assert not wrong, wrong


def test_the_streaming_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from streaming.lifecycle import job\n"
        "from streaming.driver.lookahead import HORIZON_SHARE\nfrom streaming import sinks\n"
    )
    assert _streaming_imports(bad) == {"driver", "sinks"}
