"""BENCHMARKS.md and the per-paper pages quote only what the repository holds: every script and saved run they
name exists, every link resolves, the front page is short and opens with where each paper stands, every decimal
number of its verdict tables is a figure computed from the saved runs (``benchmarks/figures.py``), every verdict
word is the one the verdict rule gives on the saved runs, and the rows are the claims of ``benchmarks/claims.toml``,
one each, with every listed deviation in the claim's row."""

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT = ROOT / "BENCHMARKS.md"
PAPERS = ROOT / "benchmarks" / "papers"
PAGES = [FRONT, *sorted(PAPERS.glob("*.md")), ROOT / "benchmarks" / "CHANGELOG.md"]
PAPER_PAGES = ("fsgp", "fedbnr", "pvi", "recyclable", "privacy-aware")
LEGEND = ("reproduced", "partial", "contradicted", "inconclusive", "not run")
SECTIONS = {"FSGP": "fsgp", "FedBNR": "fedbnr", "PVI with DPO": "pvi", "Recyclable GPs": "recyclable",
            "Privacy-aware GPR": "privacy-aware"}  # fmt: skip
NUMBER = re.compile(r"(?<![\w.])([−+-]?\d+(?:,\d{3})*\.\d+)(?![\d.])")


def _text(path: Path) -> str:
    return path.read_text()


def test_the_pages_exist_and_the_front_page_is_short():
    for name in (*PAPER_PAGES, "engineering"):
        assert (PAPERS / f"{name}.md").is_file(), name
    assert len(FRONT.read_bytes()) <= 21_000, "BENCHMARKS.md is the front page: keep it near 20 KB"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_benchmark_file_exists(page):
    named = set(re.findall(r"(?<![\w/])benchmarks/[\w/.-]+\.(?:py|jsonl|json|md|png)(?!\w)", _text(page)))
    missing = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing, f"{page.name} names files the repository does not have: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set:
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", _text(path), flags=re.MULTILINE):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
        if target.startswith("http"):
            continue
        path, _, anchor = target.partition("#")
        file = page if not path else (page.parent / path).resolve()
        if not file.is_file() or (anchor and anchor not in _anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: links to no file or heading: {broken}"


def test_every_paper_page_says_it_runs_in_the_clear():
    for name in PAPER_PAGES:
        assert "secure_aggregation=False" in _text(PAPERS / f"{name}.md"), name


def _tables(section: str) -> list:
    """The rows (lists of cells) of the Markdown tables in ``section``, without header and rule rows."""
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _section(title: str) -> str:
    text = _text(FRONT)
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_front_page_opens_with_where_each_paper_stands():
    headings = re.findall(r"^## (.+)$", _text(FRONT), flags=re.MULTILINE)
    assert headings[:2] == ["Where each paper stands", "The verdict rule"] and headings[-2:] == [
        "Not run",
        "The machine, the raw runs, the peer code",
    ]
    header, *rows = _tables(_section("Where each paper stands"))
    assert header[2:7] == list(LEGEND)
    assert [row[0].split("]")[0].lstrip("[") for row in rows] == list(SECTIONS)


def _verdicts(title: str) -> list:
    header, *rows = _tables(_section(title))
    assert header[:4] == [header[0], "verdict", "ours", "what differs"], (title, header)
    return rows


def test_each_verdict_uses_the_legend_and_the_counts_match_the_status_table():
    _, *status = _tables(_section("Where each paper stands"))
    for row, title in zip(status, SECTIONS):
        verdicts = [r[1] for r in _verdicts(title)]
        for verdict in verdicts:
            assert verdict in LEGEND, (title, verdict)
        assert int(row[1]) == len(verdicts), title
        for column, word in zip(row[2:7], LEGEND):
            assert column == str(sum(v == word for v in verdicts)), (title, word, column)


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("figures_benchmark", ROOT / "benchmarks" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_saved_figures_are_those_of_the_saved_runs(figures):
    saved = json.loads((ROOT / "benchmarks" / "results" / "figures.json").read_text())
    assert saved["command"].startswith("python benchmarks/figures.py")
    now = figures.figures()
    assert set(saved["figures"]) == set(now), "run python benchmarks/figures.py: a saved run changed"
    assert all(saved["figures"][k] == pytest.approx(v, rel=1e-12, abs=1e-15) for k, v in now.items())


def _printed(text: str) -> list:
    return [(s, float(s.replace("−", "-").replace(",", ""))) for s in NUMBER.findall(text)]


def _matches(printed: str, value: float, values: list) -> bool:
    decimals = len(printed.split(".")[1])
    return any(abs(round(v, decimals) - value) < 1e-9 for v in values)


def test_every_number_of_the_verdict_tables_is_a_saved_figure():
    """Each decimal number of the 'ours' and 'what differs' columns, as printed (sign and decimals), is the
    rounding of a figure of ``benchmarks/results/figures.json``."""
    values = list(json.loads((ROOT / "benchmarks" / "results" / "figures.json").read_text())["figures"].values())
    unmatched = []
    checked = 0
    for title in SECTIONS:
        for row in _verdicts(title):
            for printed, value in _printed(" ".join(row[2:4])):
                checked += 1
                if not _matches(printed, value, values):
                    unmatched.append(f"{title}: {printed}")
    assert checked > 100, checked
    assert not unmatched, f"numbers in BENCHMARKS.md's verdict tables that no saved figure gives: {unmatched}"


def test_the_number_check_can_fail():
    values = [0.0202, -0.1117, 9.36927]
    assert _matches("+0.020", 0.020, values) and _matches("9.4", 9.4, values)
    assert not _matches("−0.020", -0.020, values)  # the sign counts
    assert not _matches("0.112", 0.112, values)  # −0.1117 printed without its sign
    assert not _matches("9.37", 9.37, [9.36]) and _printed("a −0.016 ± 0.017 (10 of 10), M = 100") == [
        ("−0.016", -0.016),
        ("0.017", 0.017),
    ]


def test_the_fedbnr_methods_figures_give_the_tables_marks(figures, load_benchmark):
    """``figures.py``'s p-values of the saved methods runs say what ``fedbnr.py``'s RMSE marks (⇑ at p < 0.01)
    say, for every method of every saved (dataset, K)."""
    fedbnr = load_benchmark("fedbnr")
    values = figures.figures()
    paths = (ROOT / "benchmarks" / "results").glob("fedbnr_methods_k*.json")
    settings = load_benchmark("fedbnr_records").pool_method_records(str(p) for p in paths)  # reruns replace
    checked = 0
    for (name, K), by_seed in settings.items():
        records = [by_seed[s] for s in sorted(by_seed)]
        for method in records[0]:
            if method == "fedbnr":
                continue
            a, b = (np.array([r[m]["rmse"] for r in records]) for m in (method, "fedbnr"))
            p = values[f"fedbnr.methods.{name}.K{K}.{method}.p_worse"]
            assert (fedbnr.wilcoxon_mark(a, b) == "⇑") == (p < 0.01), (name, K, method, p)
            checked += 1
    assert checked == 54  # 9 methods against FedBNR in the 6 settings (3 datasets, K = 10 and 100)


@pytest.fixture(scope="module")
def claims(figures):
    return figures.load_claims()


def _rows_by_label() -> dict:
    """``{(section, first cell): row}`` of every verdict table of the front page."""
    return {(title, row[0]): row for title in SECTIONS for row in _verdicts(title)}


def test_one_row_per_claim_and_every_claim_has_its_row(claims):
    rows = _rows_by_label()
    listed = [(c["paper"], c["label"]) for c in claims]
    assert len(set(listed)) == len(listed), "two claims share a label"
    assert sorted(rows) == sorted(listed), (
        f"rows that are no claim of benchmarks/claims.toml: {sorted(set(rows) - set(listed))}; "
        f"claims without a row: {sorted(set(listed) - set(rows))}"
    )
    for claim in claims:
        assert claim["where"] and claim["says"] and claim["kind"] in ("paired", "single", "exact", "not run"), claim[
            "id"
        ]
        if claim["kind"] == "not run":
            assert claim.get("cost"), f"{claim['id']}: a not-run claim says why or what it would cost"


def test_every_deviation_is_in_its_row(claims):
    rows = _rows_by_label()
    for claim in claims:
        row = rows[(claim["paper"], claim["label"])]
        for phrase in claim.get("deviations", []):
            assert phrase in row[3], f"{claim['id']}: the row's 'what differs' lacks {phrase!r}"
        if "selected" in claim:  # shown, marked, and not what the verdict rests on
            assert "*selected*" in row[2], claim["id"]
        if "inadmissible" in claim:
            assert "inadmissible" in row[3] and row[1] == "inconclusive", claim["id"]
        if claim["kind"] == "not run":
            assert row[1] == "not run", claim["id"]


def test_every_verdict_is_the_rules_on_the_saved_runs(figures, claims):
    """The words on the page, in the saved figures and from the rule recomputed on the saved runs agree."""
    now = figures.verdicts(claims)
    saved = json.loads((ROOT / "benchmarks" / "results" / "figures.json").read_text())["verdicts"]
    assert saved == {cid: v["verdict"] for cid, v in now.items()}, "run python benchmarks/figures.py"
    rows = _rows_by_label()
    wrong = [(c["id"], rows[(c["paper"], c["label"])][1], now[c["id"]]["verdict"]) for c in claims
             if rows[(c["paper"], c["label"])][1] != now[c["id"]]["verdict"]]  # fmt: skip
    assert not wrong, f"(claim, page, rule): {wrong}"


def test_a_row_below_the_minimum_says_what_more_seeds_cost(figures, claims):
    """An inconclusive paired row whose evidence is below n_min prints the hours its missing pairs cost."""
    now = figures.verdicts(claims)
    rows = _rows_by_label()
    for claim in claims:
        v = now[claim["id"]]
        if v["verdict"] == "inconclusive" and v.get("seconds_to_n_min", 0) > 0:
            assert re.search(r"\d h\b", rows[(claim["paper"], claim["label"])][2]), claim["id"]
