"""Where the checkout is: committed checkpoints, datasets and results live beside the code."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def repo_relative(path: Path | str) -> str:
    """`path` relative to the checkout when inside it, else its last two parts: committed
    provenance must not carry the layout of the machine that wrote it."""
    p = Path(path).resolve()
    try:
        return p.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return "<outside the repository>/" + "/".join(p.parts[-2:])


def beside_repo(path: Path | str) -> str:
    """`path` relative to the checkout when it lies in the folder holding the checkout (the prompts
    in ../shared/data), else as `repo_relative` writes it: provenance a clean clone can follow."""
    p = Path(path).resolve()
    try:
        p.relative_to(REPO_ROOT.parent)
    except ValueError:
        return repo_relative(p)
    return Path(os.path.relpath(p, REPO_ROOT)).as_posix()
