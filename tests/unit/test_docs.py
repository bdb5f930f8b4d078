"""README.md is an entry point: short, the two commands first, and every link it or docs/ makes
into the repository leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 180
    assert lines[2:6] == [
        "```sh",
        "./scripts/demo.sh     # set up, launch an example agent under its policy: allowed and denied actions,"
        " audit trail",
        "./scripts/test.sh     # set up, then run lint and the whole test suite (needs ../shared/spec)",
        "```",
    ]


def test_links_in_the_readme_and_docs_lead_to_files_in_the_repository() -> None:
    broken = []
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            assert "://" not in target, f"{page.name}: a link outside the repository: {target}"
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken
