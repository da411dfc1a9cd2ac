"""The README's promises: two set-up commands, CI runs the test one, links resolve."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_has_exactly_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    block = re.search(r"## Two commands.*?```sh\n(.*?)```", README, re.S)
    assert block, "README lost its 'Two commands' section"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    ci = [
        ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith(("#", "set ", "cd "))
    ]
    assert ci == ["make test"]


def test_every_local_link_in_the_readme_and_docs_resolves() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_makefile_targets_named_in_the_readme_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"`make ([a-z-]+)", README)):
        assert re.search(rf"^{target}:", makefile, re.M), f"README names make {target}, Makefile has none"
