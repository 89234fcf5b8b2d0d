"""Where the checkout is: committed checkpoints, datasets and results live beside the code."""
from __future__ import annotations

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
