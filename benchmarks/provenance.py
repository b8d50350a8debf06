"""What every saved benchmark run records about itself: the git commit, the command, the machine's load."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any, Dict, List, Optional


def git_commit() -> str:
    """``HEAD`` of the repository this script lives in, with ``-dirty`` when the work tree has changes."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=here, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def command(script: str, argv: Optional[List[str]] = None) -> str:
    """The command that reproduces the run: ``python benchmarks/[peer/]<script> <arguments>``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.relpath(os.path.abspath(script), root)
    return " ".join(["python", path, *(sys.argv[1:] if argv is None else argv)])


def save(path: str, payload: Dict[str, Any], script: str, argv: Optional[List[str]] = None) -> None:
    """Write ``payload`` as JSON to ``path`` with ``git_commit``, ``command`` and ``machine`` added."""
    record = {
        "git_commit": git_commit(),
        "command": command(script, argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        **payload,
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(record, fh, indent=1)
