"""The threat model page is linked from the README and the docs index, and every test it cites exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "threat-model.md"


def test_threat_model_is_linked_and_cites_existing_tests():
    text = PAGE.read_text(encoding="utf-8")
    assert "docs/guides/threat-model.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "guides/threat-model" in (ROOT / "docs" / "index.rst").read_text(encoding="utf-8")
    for heading in (
        "## Adversaries",
        "## Privacy-aware release",
        "## Secure aggregation",
        "## Differential privacy",
        "## Principles",
        "## Sum-phase checks and malicious clients",
        "## Flower",
        "## Checkpoints",
    ):
        assert heading in text
    cited = set(re.findall(r"tests/[\w/]+\.py", text))
    assert cited, "the page cites no test"
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"threat-model.md cites tests that do not exist: {missing}"
