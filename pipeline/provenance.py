"""Where results come from: the commit the code runs at, recorded with every run."""

from __future__ import annotations

import subprocess
from pathlib import Path

CODE = Path(__file__).resolve().parents[1]  # the repository this code runs from


def git_state(directory: Path = CODE) -> dict[str, str]:
    """The commit the code runs at and whether tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "git_dirty": str(dirty).lower()} if commit else {}
