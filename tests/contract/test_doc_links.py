"""The README's and docs' links and images point at files that exist: results folders are
renamed and sections move between the two, and a broken plot goes unnoticed otherwise."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target up to a space, a closing bracket or a #anchor.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)")


def local_targets(document: Path) -> list[str]:
    targets = LINK.findall(document.read_text())
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # no http:, mailto:


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_local_link_and_image_exists(document: Path) -> None:
    targets = local_targets(document)
    missing = [t for t in targets if not (document.parent / t).exists()]
    assert not missing, f"{document.name} links to files that are not there: {missing}"


def test_links_are_found() -> None:
    """The check above reads the links it finds: it must find the README's plots and its
    link to the performance history."""
    targets = local_targets(ROOT / "README.md")
    assert any(t.endswith(".png") for t in targets)
    assert "docs/performance.md" in targets
