"""Paper-style figures of a run's statistics, and the τ history across commits.

One column wide (3.4 in), small fonts, one fixed colour per method (Okabe-Ito, colour-blind safe)
in every figure; lossy rows are hatched or drawn hollow. Files: `plots/{speedup,tau,depth,time}
.{png,svg}` (+ `ablation.*` for `cli.py ablate` folders); `history.{png,svg}` for `cli.py
history`. PNG and SVG carry no date or software version, so a rebuild gives identical files. Only
drawing happens here: the numbers come precomputed in a `RunStats` (harness/runs/statistics.py).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.errors import SpecbenchError
from harness.report.tables import benchmark_title, frame_label
from harness.runs.metrics import AR_METHOD
from harness.runs.statistics import (
    MEAN,
    Cell,
    Row,
    RunData,
    RunStats,
    fmt_temperature,
    is_lossy,
    row_label,
)

# One colour per method in every figure (Okabe-Ito, colour-blind safe); others get a stable pick.
METHOD_COLORS = {
    AR_METHOD: "#7F7F7F", "pld": "#E69F00", "medusa": "#56B4E9", "hydra": "#009E73",
    "eagle": "#0072B2", "eagle2": "#D55E00", "gumiho": "#CC79A7", "sps": "#332288",
}
EXTRA_COLORS = ("#882255", "#44AA99", "#999933", "#332288", "#117733", "#AA4499", "#661100")
# Several variants of one method (ablations): one colour each, in variant order.
VARIANT_COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#882255",
                  "#999933", "#332288", "#44AA99", "#117733", "#AA4499")
# Draft / verify / other in the stacked time plot: greys with hatches, apart from method colours.
PART_STYLE = {"draft": ("#404040", ""), "verify": ("#A0A0A0", ""), "other": ("#E0E0E0", "///")}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
COLUMN_WIDTH_IN = 3.4  # one column of a two-column paper


def method_color(method: str) -> str:
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    digest = int(hashlib.sha256(method.encode()).hexdigest(), 16)
    return EXTRA_COLORS[digest % len(EXTRA_COLORS)]


def row_color(run: RunData, row: Row) -> str:
    """The method's colour, or in an ablation (one method, several configs) the variant's."""
    if run.multi_variant() and row.method != AR_METHOD:
        names = list(dict.fromkeys(r.name for r in run.rows))
        return VARIANT_COLORS[names.index(row.name) % len(VARIANT_COLORS)]
    return method_color(row.method)


# ----------------------------------------------------------------------------- style and files

def _style() -> dict[str, Any]:
    return {
        "font.size": 7, "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6.5,
        "ytick.labelsize": 6.5, "legend.fontsize": 6.5, "axes.spines.top": False, "axes.spines.right": False,
        "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.axisbelow": True,
        "svg.hashsalt": "specbench", "svg.fonttype": "path", "hatch.linewidth": 0.5,
        "figure.dpi": 100, "savefig.dpi": 300, "lines.linewidth": 1.2, "lines.markersize": 3.5,
    }


def _save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
        path = out / f"{name}.{ext}"
        fig.savefig(path, format=ext, bbox_inches="tight", pad_inches=0.03, metadata=meta)
        paths.append(path)
    return paths


def _figure(height: float, width: float = COLUMN_WIDTH_IN):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _legend_above(fig, handles, labels) -> None:
    if not handles:
        return
    longest = max(len(s) for s in labels)
    ncol = min(len(labels), 2 if longest > 22 else 3 if longest > 12 else 4)
    fig.legend(handles, labels, loc="outside upper center", ncol=ncol, frameon=False,
               handlelength=1.5, columnspacing=1.0)


def _agg():
    """matplotlib without a display, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import rc_context

    return rc_context(_style())


# ----------------------------------------------------------------------------- run figures

def _bars(run: RunData, cells: dict[Row, dict[str, Cell]], metric: str, ylabel: str,
          columns: list[str] | None = None, titles: dict[str, str] | None = None):
    """Grouped bars of `metric` per benchmark (or per `columns`, labelled `titles`), one panel per temperature."""
    temps = [t for t in run.temperatures if any(r.temperature == t for r in run.rows)]
    fig = _figure(0.55 + 1.55 * len(temps))
    axes = fig.subplots(len(temps), 1, squeeze=False)[:, 0]
    columns = run.columns if columns is None else columns
    title = (lambda c: titles[c]) if titles else benchmark_title
    handles: dict[str, Any] = {}
    for ax, t in zip(axes, temps):
        rows = [r for r in run.rows if r.temperature == t]
        width = 0.8 / len(rows)
        x = np.arange(len(columns))
        for i, row in enumerate(rows):
            values = np.array([getattr(cells[row][b], metric) for b in columns])
            cis = np.array([getattr(cells[row][b], f"{metric}_ci") for b in columns])
            err = np.abs(np.vstack([values - cis[:, 0], cis[:, 1] - values]))
            err = np.where(np.isfinite(err), err, 0.0)
            bars = ax.bar(x - 0.4 + width * (i + 0.5), np.nan_to_num(values), width * 0.92,
                          color=row_color(run, row), hatch="////" if row.lossy else "", edgecolor="white",
                          linewidth=0.3, yerr=err, error_kw={"elinewidth": 0.6, "capsize": 1.2, "ecolor": "#333333"})
            handles.setdefault(row.label, bars)
        ax.axhline(1.0, color=METHOD_COLORS[AR_METHOD], linestyle="--", linewidth=0.8, zorder=0)
        ax.set_xticks(x, [title(b) for b in columns],
                      rotation=30 if len(columns) > 4 else 0, ha="right" if len(columns) > 4 else "center",
                      rotation_mode="anchor")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(axis="x", visible=False)
        if len(temps) > 1 or any(t > 0 for t in temps):
            ax.set_title(f"T = {fmt_temperature(t)}", loc="left")
    _legend_above(fig, list(handles.values()), list(handles))
    return fig


def _depth_plot(run: RunData, curves: dict[Row, list[float]]):
    fig = _figure(2.2)
    ax = fig.subplots()
    temps = run.temperatures
    handles, labels = [], []
    for row in run.rows:
        curve = curves[row]
        if not curve:
            continue
        style = LINESTYLES[temps.index(row.temperature) % len(LINESTYLES)]
        (line,) = ax.plot(range(1, len(curve) + 1), curve, linestyle=style, marker="o", color=row_color(run, row),
                          markerfacecolor="white" if row.lossy else row_color(run, row))
        handles.append(line)
        labels.append(row.label + (f", T={fmt_temperature(row.temperature)}" if len(temps) > 1 else ""))
    ax.set_xlabel("Depth d (drafts accepted in one step)")
    ax.set_ylabel("Share of steps reaching d")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend_above(fig, handles, labels)
    return fig


def _time_plot(run: RunData, cost: pd.DataFrame):
    rows = cost.to_dict("records")
    fig = _figure(0.75 + 0.24 * len(rows))
    ax = fig.subplots()
    temps = sorted(set(cost["temperature"]))
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for part in ("draft", "verify", "other"):
        values = np.array([max(0.0, r[f"{part}_ms_per_step"]) if np.isfinite(r[f"{part}_ms_per_step"]) else 0.0
                           for r in rows])
        color, hatch = PART_STYLE[part]
        ax.barh(y, values, 0.65, left=left, color=color, hatch=hatch, edgecolor="white" if not hatch else "#808080",
                linewidth=0.3, label=part)
        left += values
    names = [frame_label(r) + (f"  T={fmt_temperature(r['temperature'])}" if len(temps) > 1 else "") for r in rows]
    ax.set_yticks(y, names)
    for tick, r in zip(ax.get_yticklabels(), rows):
        row = Row(r["temperature"], r["method"], r["config_hash"], r["acceptance"], r["variant"], r["lossy"])
        tick.set_color(row_color(run, row))
    ax.set_xlabel("Milliseconds per verify step")
    ax.grid(axis="y", visible=False)
    handles, labels = ax.get_legend_handles_labels()
    _legend_above(fig, handles, labels)
    return fig


def _ablation_plot(run: RunData, cells: dict[Row, dict[str, Cell]]):
    """Mean speedup and τ against each swept value (columns: swept keys; rows: metric)."""
    ab = run.ablation or {}
    sweep: dict[str, list] = ab.get("sweep", {})
    variants: dict[str, dict] = ab.get("variants", {})
    base: dict = ab.get("base_config", {})
    keys = list(sweep)
    if not keys:
        return None
    temps = run.temperatures
    fig = _figure(0.5 + 1.5 * 2, max(COLUMN_WIDTH_IN, 1.7 * len(keys)))
    axes = fig.subplots(2, len(keys), squeeze=False)
    handles: dict[str, Any] = {}
    by_name = {(r.name, r.temperature): r for r in run.rows}
    for j, key in enumerate(keys):
        values = list(dict.fromkeys([base.get(key), *sweep[key]]))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            values = sorted(values)
        ticks = [json.dumps(v) if not isinstance(v, str) else v for v in values]
        # Lines: variants sharing every other swept key's value (one line in a one-factor sweep).
        groups: dict[tuple, list[str]] = {}
        for name, overrides in variants.items():
            cfg = {**base, **overrides}
            others = {k: cfg.get(k) for k in keys if k != key}
            if ab.get("grid") or all(cfg.get(k) == base.get(k) for k in others):
                groups.setdefault(tuple(json.dumps(v) for v in others.values()), []).append(name)
        for i, metric in enumerate(("speedup", "tau")):
            ax = axes[i][j]
            for g, (other_values, names) in enumerate(groups.items()):
                for ti, t in enumerate(temps):
                    pts = []
                    for name in names:
                        row = by_name.get((name, t))
                        if row is None:
                            continue
                        v = {**base, **variants[name]}.get(key)
                        c = cells[row][MEAN]
                        lo, hi = getattr(c, f"{metric}_ci")
                        pts.append((values.index(v), getattr(c, metric), lo, hi))
                    if not pts:
                        continue
                    pts.sort()
                    xs, ys, lo, hi = (np.array(a, dtype=float) for a in zip(*pts))
                    err = np.where(np.isfinite([ys - lo, hi - ys]), np.abs([ys - lo, hi - ys]), 0.0)
                    color = (VARIANT_COLORS[g % len(VARIANT_COLORS)] if len(groups) > 1
                             else method_color(ab.get("method", "")))
                    label = ", ".join(f"{k}={v}" for k, v in zip([k for k in keys if k != key], other_values)) \
                        if len(groups) > 1 else ab.get("method", "")
                    if len(temps) > 1:
                        label += f" T={fmt_temperature(t)}"
                    h = ax.errorbar(xs, ys, yerr=err, color=color, marker=MARKERS[g % len(MARKERS)],
                                    linestyle=LINESTYLES[ti % len(LINESTYLES)], capsize=1.5, elinewidth=0.6)
                    handles.setdefault(label, h)
            ax.set_xticks(range(len(values)), ticks)
            ax.set_xlim(-0.5, len(values) - 0.5)
            if i == 1:
                ax.set_xlabel(f"{key} (default {json.dumps(base.get(key))})")
            if j == 0:
                ax.set_ylabel("Mean speedup (×)" if metric == "speedup" else "Mean τ")
    if len(handles) > 1 or len(temps) > 1:
        _legend_above(fig, list(handles.values()), list(handles))
    return fig


def write_plots(stats: RunStats) -> list[Path]:
    """Write plots/{speedup,tau,depth,time}.{png,svg} (+ ablation.*, + turns.* where a benchmark has
    several turns, + categories.* for prompt files with several categories) for a run folder."""
    run = stats.run
    if not run.rows:
        raise SpecbenchError(f"{run.path} holds AR records only: nothing to plot")
    out = run.path / "plots"
    paths: list[Path] = []
    with _agg():
        figures = [("speedup", _bars(run, stats.cells, "speedup", "Speedup over AR (×)")),
                   ("tau", _bars(run, stats.cells, "tau", "τ (tokens per verify step)")),
                   ("depth", _depth_plot(run, stats.curves)), ("time", _time_plot(run, stats.cost))]
        if run.ablation:
            figures.append(("ablation", _ablation_plot(run, stats.cells)))
        if stats.turn_cells is not None:
            turns = stats.turn_cells
            figures.append(("turns", _bars(run, turns.cells, "tau", "τ (tokens per verify step)", turns.columns,
                                           turns.titles)))
        if stats.categories is not None:
            cat = stats.categories
            figures.append(("categories", _bars(run, cat.cells, "speedup", "Speedup over AR (×)", cat.columns,
                                                cat.titles)))
        for name, fig in figures:
            if fig is not None:
                paths += _save(fig, out, name)
    return paths


# ----------------------------------------------------------------------------- history

def plot_history(frame: pd.DataFrame, out: Path, benchmark: str | None = None, name: str = "history") -> list[Path]:
    """τ per commit, one line per (method, acceptance), from `regress.history_frame`."""
    commits = frame.drop_duplicates("commit").sort_values("order")
    labels = [str(c)[:7] + ("*" if d else "") for c, d in zip(commits["commit"], commits["dirty"])]
    with _agg():
        fig = _figure(2.3)
        ax = fig.subplots()
        handles, names = [], []
        for (method, acceptance), g in frame.groupby(["method", "acceptance"], sort=False):
            lossy = is_lossy(g.iloc[-1])
            (h,) = ax.plot(g["order"], g["tau"], marker="o", color=method_color(method),
                           linestyle="--" if lossy else "-")
            handles.append(h)
            names.append(row_label(method, acceptance, lossy))
        ax.set_xticks(np.arange(len(labels)), labels, rotation=45 if len(labels) > 4 else 0,
                      ha="right" if len(labels) > 4 else "center", rotation_mode="anchor")
        ax.set_xlabel("Commit (* = uncommitted changes)")
        ax.set_ylabel(f"τ ({benchmark})" if benchmark else "τ (mean over benchmarks)")
        ax.grid(axis="x", visible=False)
        _legend_above(fig, handles, names)
        return _save(fig, Path(out), name)


# ----------------------------------------------------------------------------- training

def plot_training_curves(frame: pd.DataFrame, out: Path, name: str = "training-curves") -> list[Path]:
    """Held-out top-1 against optimiser step, one panel per checkpoint, one line per predicted
    depth (from `training_curves.read_curves`)."""
    ckpts = list(dict.fromkeys(frame["checkpoint"]))
    with _agg():
        fig = _figure(1.6 * ((len(ckpts) + 1) // 2) + 0.4, COLUMN_WIDTH_IN * (2 if len(ckpts) > 1 else 1))
        axes = np.atleast_1d(fig.subplots((len(ckpts) + 1) // 2, 2 if len(ckpts) > 1 else 1, squeeze=False)).ravel()
        for ax, ckpt in zip(axes, ckpts):
            g = frame[frame["checkpoint"] == ckpt]
            color = method_color(g["method"].iloc[0])
            metrics = list(dict.fromkeys(g["metric"]))
            for i, metric in enumerate(metrics):
                m = g[g["metric"] == metric]
                ax.plot(m["step"], m["top1"], marker="o", color=color, alpha=1.0 - 0.6 * i / max(1, len(metrics) - 1),
                        label=metric)
            ax.set_title(ckpt)
            ax.set_xlabel("Optimiser step")
            ax.set_ylabel("Held-out top-1")
            ax.legend(frameon=False, fontsize=5.5)
        for ax in axes[len(ckpts):]:
            ax.set_visible(False)
        return _save(fig, Path(out), name)
