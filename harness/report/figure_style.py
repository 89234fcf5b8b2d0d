"""The look every figure shares: one column wide (3.4 in, ~700 px at README width), small fonts,
one colour per method (harness/runs/method_display.py) and a palette for
the variants of one method, a grey caption line under everything, and files that carry no date or
software version (PNG and SVG), so a rebuild gives identical bytes. Drawing is in
harness/report/plots.py."""
from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any

from harness.core.files import write_atomic
from harness.runs.method_display import method_display

# Several variants of one method (ablations): one colour each, in variant order, after the
# method's own colour (which the first variant, the default, takes).
VARIANT_COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#882255",
                  "#999933", "#332288", "#44AA99", "#117733", "#AA4499")
COLUMN_WIDTH_IN = 3.4  # one column of a two-column paper; ~700 px at README width
CAPTION_CHARS = 84     # characters per caption line at the caption's font size and column width


def method_color(method: str) -> str:
    """The method's declared colour (AR grey; a stable spare colour for undeclared methods)."""
    return method_display(method).color


def variant_colors(method: str) -> list[str]:
    """Colours for the variants of `method`: its own first, then the variant palette."""
    own = method_color(method)
    return [own, *[c for c in VARIANT_COLORS if c.lower() != own.lower()]]


def style_rc() -> dict[str, Any]:
    return {
        "font.size": 7, "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6.5,
        "ytick.labelsize": 6.5, "legend.fontsize": 6.5, "axes.spines.top": False, "axes.spines.right": False,
        "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.axisbelow": True,
        "svg.hashsalt": "specbench", "svg.fonttype": "path", "hatch.linewidth": 0.5,
        "figure.dpi": 100, "savefig.dpi": 300, "lines.linewidth": 1.2, "lines.markersize": 3.5,
    }


def save_figure(fig, out: Path, name: str) -> list[Path]:
    """`out/name.png` and `.svg`, each rendered whole before it replaces the file (a full disk
    leaves the previous figure)."""
    paths = []
    for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", pad_inches=0.03, metadata=meta)
        paths.append(write_atomic(out / f"{name}.{ext}", buf.getvalue()))
    return paths


def new_figure(height: float, width: float = COLUMN_WIDTH_IN):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def legend_above(fig, handles, labels) -> None:
    if not handles:
        return
    longest = max(len(s) for s in labels)
    ncol = min(len(labels), 2 if longest > 22 else 3 if longest > 12 else 4)
    # matplotlib fills a legend column by column; reorder so that it reads row by row, in row order
    nrows = math.ceil(len(labels) / ncol)
    order = [r * ncol + c for c in range(ncol) for r in range(nrows) if r * ncol + c < len(labels)]
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside upper center", ncol=ncol,
               frameon=False, handlelength=1.5, columnspacing=1.0)


def caption(fig, text: str, width: float = COLUMN_WIDTH_IN) -> None:
    """The figure's caption line(s) under everything else, small and grey."""
    chars = int(CAPTION_CHARS * width / COLUMN_WIDTH_IN)
    fig.supxlabel("\n".join(textwrap.wrap(text, chars)), fontsize=5.5, color="#444444", ha="center")


def agg_context():
    """matplotlib without a display, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import rc_context

    return rc_context(style_rc())


def shade(color: str, i: int, n: int) -> str:
    """`color` lightened towards white for the i-th of n series: the nearest depth is the darkest."""
    from matplotlib.colors import to_hex, to_rgb

    mix = 0.7 * i / max(1, n - 1)
    return to_hex([c + (1.0 - c) * mix for c in to_rgb(color)])
