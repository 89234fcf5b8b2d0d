"""Where the checkout is: committed checkpoints, datasets and results live beside the code."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
