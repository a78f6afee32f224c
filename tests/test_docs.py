"""The project's own docs/ hold the definitions the code relies on: comments cite docs/ pages that
exist, never notes outside the repository, and the README's sections point at docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for folder in ("specbench", "tests", "suites", "bench") for p in (ROOT / folder).rglob("*.py")]
# notes beside the checkout that the code must never rely on (the prompt data directory is data, not notes)
OUTSIDE_NOTES = re.compile(r"FIELD_NOTES|DESIGN\.md|\.\./shared/(?!data)")
DOC_CITATION = re.compile(r"docs/([a-z_]+\.md)")


def test_no_source_cites_notes_outside_the_repository():
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES if p.name != "test_docs.py"
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE_NOTES.search(line)]
    assert not offenders, f"cite docs/ instead: {offenders}"


def test_every_cited_docs_page_exists():
    cited = {m.group(1) for p in SOURCES for m in DOC_CITATION.finditer(p.read_text(encoding="utf-8"))}
    assert cited, "no source cites docs/: the check would pass vacuously"
    missing = sorted(page for page in cited if not (ROOT / "docs" / page).is_file())
    assert not missing, f"cited but absent from docs/: {missing}"


def test_readme_sections_point_at_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", readme, flags=re.M | re.S))
    for title, page in (("What it measures (definitions)", "metrics.md"), ("Engine", "verification.md"),
                        ("Engine", "engines.md"), ("Medusa checkpoints", "checkpoints.md")):
        assert f"docs/{page}" in sections[title], f"README section {title!r} does not point at docs/{page}"
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    for page in sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"):
        assert f"]({page})" in index, f"docs/README.md does not list {page}"
