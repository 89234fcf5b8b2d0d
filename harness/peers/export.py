"""`cli.py export METHOD --layout official`: a drafter's weights written in its paper's official
layout, which the official code (the peers) loads unchanged.

The layout of each method, and what it cannot express, is the method's own (`official_files`,
the inverse of its `load_official`: methods/common/official_layout.py); this module picks the
drafter, writes the files and records where the weights came from.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import SpecbenchError, unknown

LAYOUTS = ("official",)


@dataclass
class Export:
    """What `export_drafter` wrote: the files and one line per departure from the official layout."""

    folder: Path
    files: list[Path]
    departures: list[str]


def export_drafter(method: str, target, out: str | Path, checkpoint: str | None = None,
                   base_model: str | None = None, layout: str = "official") -> Export:
    """Write `method`'s drafter on `target` (the committed default weights, or `checkpoint`) into
    `out` in `layout`; `base_model` is written where the layout's config names the base model
    folder (Medusa, Hydra; default: the target's name)."""
    from methods.registry import get_method

    if layout not in LAYOUTS:
        raise unknown("layout", layout, LAYOUTS)
    cls = get_method(method)
    if not cls.trainable:
        raise SpecbenchError(f"method '{method}' is training-free: it has no weights to export")
    drafter = cls.create(target, {}, checkpoint)
    files = drafter.official_files(base_model)
    provenance = {"method": method, "target": target.name, "weights_hash": drafter.checkpoint_hash(),
                  "layout": layout}
    return Export(Path(out), files.write(Path(out), provenance), files.departures)
