"""BENCHMARKS.md quotes only what the repository holds: every script and saved run it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "BENCHMARKS.md").read_text()


def test_every_named_benchmark_file_exists():
    named = set(re.findall(r"(?<![\w/])benchmarks/[\w/.-]+\.(?:py|jsonl|json)(?!\w)", TEXT))
    assert named, "BENCHMARKS.md names no script or saved run"
    missing = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing, f"BENCHMARKS.md names files the repository does not have: {missing}"


def test_the_summary_comes_first():
    """The verdict per paper is on the first screen: before the first detailed section."""
    headings = re.findall(r"^(#{2,3}) (.+)$", TEXT, flags=re.MULTILINE)
    assert headings[0][1].startswith("Summary"), headings[:3]
    papers = ("FSGP", "FedBNR", "PVI", "Recyclable", "Privacy-aware")
    summary = TEXT[: TEXT.index("\n## ", TEXT.index("## Summary") + 1)]
    for paper in papers:
        assert f"### {paper}" in summary, paper
    assert "Not run" in summary


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_internal_link_has_its_heading():
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", TEXT, flags=re.MULTILINE):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    links = set(re.findall(r"\]\(#([^)]+)\)", TEXT))
    assert not sorted(links - anchors), f"links to no heading: {sorted(links - anchors)}"
