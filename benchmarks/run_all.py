"""Run every benchmark script in this folder, one after the other (``make bench``).

Each script prints its own Markdown table; BENCHMARKS.md records the tables with the commands that produced
them. ``--quick`` is passed to the scripts that offer a quick mode; ``--only NAME ...`` runs a subset.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    return sorted(p for p in HERE.glob("*.py") if p.name != Path(__file__).name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="pass --quick to the scripts that support it")
    parser.add_argument("--only", nargs="+", default=None, help="script names without .py")
    args = parser.parse_args()
    chosen = [p for p in scripts() if args.only is None or p.stem in args.only]
    failures = []
    for script in chosen:
        command = [sys.executable, str(script)]
        if args.quick and "--quick" in script.read_text():
            command.append("--quick")
        print(f"\n### {script.name}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call(command)
        print(f"({script.name}: exit {rc}, {time.perf_counter() - start:.0f} s)", flush=True)
        if rc != 0:
            failures.append(script.name)
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
