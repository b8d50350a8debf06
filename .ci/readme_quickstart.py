"""Run the README's Quickstart block as written (``make test-core-install`` runs it in a core-only venv).

Usage: ``python .ci/readme_quickstart.py README.md [ROUNDS]``; ``ROUNDS`` replaces ``rounds=100`` (default: as
written). Exits non-zero if the block fails or is not found.
"""

import re
import sys
from pathlib import Path


def main(argv: list) -> int:
    readme = Path(argv[0]).read_text(encoding="utf-8")
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    blocks = re.findall(r"```python\n(.*?)```", section.group(1) if section else "", flags=re.S)
    if len(blocks) != 1:
        print("README.md: expected one python block under '## Quickstart'", file=sys.stderr)
        return 1
    code = blocks[0] if len(argv) < 2 else blocks[0].replace("rounds=100", f"rounds={int(argv[1])}")
    exec(compile(code, "README.md#quickstart", "exec"), {"__name__": "__main__"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
