"""A training longer than one session keeps its resume state in git: machines change between
sessions and take their disks with them, so a trainer writing into the repository commits its
output folder (weights, `trainer_state.pt`, the log) every `every_s` seconds of wall time.

Only that folder goes into the commit (`git commit --only`), whatever else is staged, and a
commit that cannot be made now (another git command holds the index, a merge is under way) is
tried again at the next checkpoint: committing never stops a training. When HEAD is this
trainer's own last state commit, it is amended instead, so a session that commits nothing else
in between keeps one copy of the state, not one per half hour.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

SUBJECT = "training state:"


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def repo_root(path: Path) -> Path | None:
    """The git checkout holding `path`, or None."""
    out = _git(["rev-parse", "--show-toplevel"], path if path.is_dir() else path.parent)
    return Path(out.stdout.strip()) if out.returncode == 0 else None


class StateCommitter:
    """Commits `folder` (inside a git checkout) at most every `every_s` seconds."""

    def __init__(self, folder: Path, every_s: float, label: str) -> None:
        self.folder = Path(folder)
        self.every_s = every_s
        self.label = label
        self.last = time.monotonic()
        self.root: Path | None = None

    def maybe_commit(self, step: int, force: bool = False) -> str | None:
        """Commit the folder if the interval passed (or `force`); returns what happened, or None
        when nothing was due. Never raises for a git failure: it is retried next time."""
        if not force and time.monotonic() - self.last < self.every_s:
            return None
        self.root = self.root or repo_root(self.folder)
        if self.root is None:
            return f"{self.folder} is not inside a git checkout: its state is not committed"
        rel = str(self.folder.resolve().relative_to(self.root))
        message = f"{SUBJECT} {self.label} at step {step} ({rel}; resume by rerunning the training command)"
        add = _git(["add", "-f", "--", rel], self.root)
        if add.returncode != 0:
            return f"state not committed ({add.stderr.strip().splitlines()[-1] if add.stderr.strip() else 'git add failed'})"
        head = _git(["log", "-1", "--format=%s"], self.root).stdout.strip()
        amend = head.startswith(f"{SUBJECT} {self.label} ")
        done = _git(["commit", "-q", *(["--amend"] if amend else []), "-m", message, "--only", "--", rel], self.root)
        if done.returncode != 0:
            text = (done.stdout + done.stderr).strip()
            if "nothing to commit" in text or "no changes added" in text:
                self.last = time.monotonic()
                return None
            return f"state not committed yet ({text.splitlines()[-1] if text else 'git commit failed'}); retried later"
        self.last = time.monotonic()
        return f"committed the training state at step {step}" + (" (amending the last)" if amend else "")
