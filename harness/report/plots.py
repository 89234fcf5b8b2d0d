"""Paper-style figures of a run's statistics, and the τ history across commits.

The shared look (size, fonts, colours, captions, date-free files) is harness/report/figure_style.py;
every figure names a method by its display name (harness/runs/method_display.py). Lossy rows are hatched or drawn
hollow. Every figure ends with a caption line: target, dtype, machine, answers per cell (or row),
and the interval shown. Files: `plots/{speedup,tau,depth,time}.{png,svg}` (+ `ablation.*` for
`cli.py ablate` folders); `history.{png,svg}` for `cli.py history`. PNG and SVG carry no date or
software version, so a rebuild gives identical files. Only drawing happens here: the numbers come
precomputed in a `RunStats` (harness/report/statistics.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.errors import SpecbenchError
from harness.report.figure_style import (
    COLUMN_WIDTH_IN,
    VARIANT_COLORS,
    agg_context,
    caption,
    legend_above,
    method_color,
    new_figure,
    save_figure,
    shade,
    variant_colors,
)
from harness.report.statistics import Cell, RunStats
from harness.report.tables import answers_text, benchmark_title, frame_label, setting_text
from harness.runs.method_display import method_display
from harness.runs.metrics import CI_LEVEL
from harness.runs.record import AR_METHOD, is_lossy
from harness.runs.run_data import MEAN, Row, RunData, display_label, fmt_temperature, row_label

# Draft / verify / other in the time plot: greys and a hatch, apart from the method colours.
PART_STYLE = {"draft": ("#3A3A3A", ""), "verify": ("#B4B4B4", ""), "other": ("#FFFFFF", "//////")}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
INTERVAL = f"{int(CI_LEVEL * 100)}% bootstrap intervals over answers"


def row_color(run: RunData, row: Row) -> str:
    """The method's colour, or in an ablation (one method, several configs) the variant's."""
    if run.multi_variant() and row.method != AR_METHOD:
        names = list(dict.fromkeys(r.name for r in run.rows if r.method == row.method))
        colors = variant_colors(row.method)
        return colors[names.index(row.name) % len(colors)]
    return method_color(row.method)


def run_caption(run: RunData, answers: list[int], per: str, shown: str) -> str:
    """'<target>, <dtype>, <machine> · <n> answers per <per> · <shown>'."""
    return f"{setting_text(run)} · {answers_text(answers)} answers per {per} · {shown}"


def _temperature_title(ax, t: float, temps: list[float]) -> None:
    if len(temps) > 1 or any(x > 0 for x in temps):
        ax.set_title(f"T = {fmt_temperature(t)}", loc="left")


# ----------------------------------------------------------------------------- run figures

def _bars(run: RunData, cells: dict[Row, dict[str, Cell]], metric: str, ylabel: str,
          columns: list[str] | None = None, titles: dict[str, str] | None = None):
    """Grouped bars of `metric` per benchmark (or per `columns`, labelled `titles`), one panel per temperature."""
    temps = [t for t in run.temperatures if any(r.temperature == t for r in run.rows)]
    fig = new_figure(0.75 + 1.55 * len(temps))
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
        ax.axhline(1.0, color=method_color(AR_METHOD), linestyle="--", linewidth=0.8, zorder=0)
        ax.set_xticks(x, [title(b) for b in columns],
                      rotation=30 if len(columns) > 4 else 0, ha="right" if len(columns) > 4 else "center",
                      rotation_mode="anchor")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(axis="x", visible=False)
        _temperature_title(ax, t, temps)
    legend_above(fig, list(handles.values()), list(handles))
    answers = [c.answers for by in cells.values() for b, c in by.items() if b != MEAN]
    caption(fig, run_caption(run, answers, "cell", f"whiskers: {INTERVAL}; dashed line: AR"))
    return fig


def _depth_plot(run: RunData, curves: dict[Row, list[float]]):
    """Small multiples: one panel per method (or ablation variant), one line per temperature and
    acceptance rule, the same line style for the same setting in every panel."""
    from matplotlib.lines import Line2D

    rows = [r for r in run.rows if curves[r]]
    if not rows:
        return None
    panels = list(dict.fromkeys(r.name for r in rows))
    settings = list(dict.fromkeys((r.temperature, r.acceptance, r.lossy) for r in rows))
    ncols = 1 if len(panels) == 1 else 2 if len(panels) <= 6 else 3
    nrows = math.ceil(len(panels) / ncols)
    fig = new_figure(0.75 + 1.05 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    depth = max(len(curves[r]) for r in rows)
    for i, name in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        mine = [r for r in rows if r.name == name]
        for row in mine:
            k = settings.index((row.temperature, row.acceptance, row.lossy))
            color = row_color(run, row)
            curve = curves[row]
            ax.plot(range(1, len(curve) + 1), curve, linestyle=LINESTYLES[k % len(LINESTYLES)],
                    marker=MARKERS[k % len(MARKERS)], color=color, markersize=2.5,
                    markerfacecolor="white" if row.lossy else color, markeredgewidth=0.7)
        ax.set_title(display_label(name, mine[0].method), loc="left", color=row_color(run, mine[0]),
                     fontweight="bold", pad=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlim(0.5, depth + 0.5)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for j in range(len(panels), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    for r in range(nrows):
        axes[r][0].set_ylabel("Steps reaching d")
    for c in range(ncols):
        bottom = max(r for r in range(nrows) if r * ncols + c < len(panels))
        axes[bottom][c].set_xlabel("Depth d (drafts accepted)")
        axes[bottom][c].xaxis.set_tick_params(labelbottom=True)
    if len(settings) > 1:
        handles = [Line2D([], [], color="#444444", linestyle=LINESTYLES[k % len(LINESTYLES)],
                          marker=MARKERS[k % len(MARKERS)], markersize=3,
                          markerfacecolor="white" if lossy else "#444444")
                   for k, (t, acceptance, lossy) in enumerate(settings)]
        labels = [f"T={fmt_temperature(t)} {acceptance}" + (" (lossy)" if lossy else "")
                  for t, acceptance, lossy in settings]
        legend_above(fig, handles, labels)
    answers = [len(run.row_records(r)) for r in rows]
    caption(fig, run_caption(run, answers, "row", "share of all verify steps, pooled over benchmarks; no intervals"))
    return fig


def _time_plot(run: RunData, cost: pd.DataFrame):
    """Milliseconds per generated token (ms per verify step / τ), split into draft / verify / other,
    one panel per temperature, with AR's ms per token as a line; 'other' again on its own scale at
    the right, where it is visible."""
    from matplotlib.lines import Line2D

    temps = sorted(set(cost["temperature"]))
    blocks = [(t, cost[(cost.temperature == t)]) for t in temps]
    blocks = [(t, b[b.method != AR_METHOD], b[b.method == AR_METHOD]) for t, b in blocks]
    blocks = [(t, b, ar) for t, b, ar in blocks if len(b)]
    n_rows = sum(len(b) for _, b, _ in blocks)
    fig = new_figure(0.95 + 0.2 * n_rows + 0.35 * len(blocks))
    grid = fig.add_gridspec(len(blocks), 2, width_ratios=[3.3, 1], height_ratios=[len(b) + 1.2 for _, b, _ in blocks])
    handles: dict[str, Any] = {}
    # One ms/token scale for every temperature, so panels compare; 'other' on each panel's own.
    right = np.nanmax(np.r_[cost["ms_per_token"], cost["ms_per_token_hi"]]) * 1.04
    for i, (t, block, ar) in enumerate(blocks):
        ax = fig.add_subplot(grid[i, 0], label=f"time T={fmt_temperature(t)}")
        zoom = fig.add_subplot(grid[i, 1], sharey=ax, label=f"other T={fmt_temperature(t)}")
        recs = block.to_dict("records")
        y = np.arange(len(recs))[::-1]
        left = np.zeros(len(recs))
        for part in ("draft", "verify", "other"):
            values = np.array([max(0.0, r[f"{part}_ms_per_token"]) if np.isfinite(r[f"{part}_ms_per_token"])
                               else 0.0 for r in recs])
            color, hatch = PART_STYLE[part]
            bars = ax.barh(y, values, 0.7, left=left, color=color, hatch=hatch, edgecolor="#606060", linewidth=0.3)
            handles.setdefault(part, bars)
            left += values
            if part == "other":
                zoom.barh(y, values, 0.7, color=color, hatch=hatch, edgecolor="#606060", linewidth=0.3)
        total = np.array([r["ms_per_token"] for r in recs])
        lo = np.array([r["ms_per_token_lo"] for r in recs])
        hi = np.array([r["ms_per_token_hi"] for r in recs])
        err = np.where(np.isfinite([total - lo, hi - total]), np.abs([total - lo, hi - total]), 0.0)
        ax.errorbar(total, y, xerr=err, fmt="none", ecolor="black", elinewidth=0.6, capsize=1.5)
        if len(ar):
            a = ar.iloc[0]
            handles.setdefault("AR", Line2D([], [], color=method_color(AR_METHOD), linestyle="--", linewidth=1.0))
            ax.axvline(a["ms_per_token"], color=method_color(AR_METHOD), linestyle="--", linewidth=1.0, zorder=3)
            ax.text(a["ms_per_token"], len(recs) - 0.35, f" AR {a['ms_per_token']:.1f}", fontsize=5.5,
                    color="#404040", va="bottom", ha="left")
            if np.isfinite(a["other_ms_per_token"]):
                zoom.axvline(a["other_ms_per_token"], color=method_color(AR_METHOD), linestyle="--", linewidth=1.0)
        ax.set_yticks(y, [frame_label(r) for r in recs])
        ax.set_ylim(-0.6, len(recs) + 0.2)
        ax.set_xlim(0, right)
        zoom.set_xlim(left=0)
        zoom.tick_params(axis="y", labelleft=False)
        for a_ in (ax, zoom):
            a_.grid(axis="y", visible=False)
        _temperature_title(ax, t, temps)
        if i == len(blocks) - 1:
            ax.set_xlabel("ms per generated token")
            zoom.set_xlabel("other, own scale")
    fig.legend(list(handles.values()), list(handles), loc="outside upper center", ncol=len(handles), frameon=False,
               handlelength=1.5, columnspacing=1.0)
    answers = [int(r) for r in cost[cost.method != AR_METHOD]["answers"]]
    caption(fig, run_caption(run, answers, "row", f"bars: ms per verify step / τ, pooled over benchmarks; "
                                                   f"whiskers: {INTERVAL}"))
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
    fig = new_figure(0.5 + 1.5 * 2, max(COLUMN_WIDTH_IN, 1.7 * len(keys)))
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
                    color = variant_colors(ab.get("method", ""))[g % len(VARIANT_COLORS)]
                    label = ", ".join(f"{k}={v}" for k, v in zip([k for k in keys if k != key], other_values)) \
                        if len(groups) > 1 else display_label(ab.get("method", ""))
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
    axes[0][0].set_title(f"{display_label(ab.get('method', ''))}: {', '.join(keys)}", loc="left")
    if len(handles) > 1 or len(temps) > 1:
        legend_above(fig, list(handles.values()), list(handles))
    answers = [c.answers for by in cells.values() for b, c in by.items() if b != MEAN]
    caption(fig, run_caption(run, answers, "cell", f"points: Mean over benchmarks; whiskers: {INTERVAL}"),
            max(COLUMN_WIDTH_IN, 1.7 * len(keys)))
    return fig


def write_plots(stats: RunStats) -> list[Path]:
    """Write plots/{speedup,tau,depth,time}.{png,svg} (+ ablation.*, + turns.* where a benchmark has
    several turns, + categories.* for prompt files with several categories) for a run folder."""
    run = stats.run
    if not run.rows:
        raise SpecbenchError(f"{run.path} holds AR records only: nothing to plot")
    out = run.path / "plots"
    paths: list[Path] = []
    with agg_context():
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
                paths += save_figure(fig, out, name)
    return paths


# ----------------------------------------------------------------------------- history

def plot_history(frame: pd.DataFrame, out: Path, benchmark: str | None = None, name: str = "history",
                 setting: str = "", tolerance: float | None = None) -> list[Path]:
    """τ (top) and depth-1 acceptance (bottom) per commit, one line per (method, acceptance), from
    `history.history_frame`; a point whose value moved beyond the tolerance from the method's
    previous commit (`tau_moved` / `depth1_moved`) is ringed. `setting` (target, dtype) leads
    the caption when the caller knows it."""
    commits = frame.drop_duplicates("commit").sort_values("order")
    labels = [str(c)[:7] + ("*" if d else "") for c, d in zip(commits["commit"], commits["dirty"])]
    has_depth1 = "depth1" in frame and bool(frame["depth1"].notna().any())  # old lines lack it
    panels = [("tau", "τ")] + ([("depth1", "depth-1 acceptance")] if has_depth1 else [])
    wide = len(labels) > 8
    if "rank" in frame:  # legend in the methods' declared table order, not order of first appearance
        frame = frame.sort_values(["rank", "order"], kind="stable")
    with agg_context():
        fig = new_figure(1.5 + 1.4 * len(panels), COLUMN_WIDTH_IN * (2 if wide else 1))
        axes = np.atleast_1d(fig.subplots(len(panels), 1, sharex=True))
        handles, names = [], []
        for ax, (q, title) in zip(axes, panels):
            for (method, acceptance), g in frame.groupby(["method", "acceptance"], sort=False):
                lossy = is_lossy(g.iloc[-1])
                color = method_color(method)
                (h,) = ax.plot(g["order"], g[q], marker="o", markersize=3, color=color,
                               linestyle="--" if lossy else "-")
                moved = g[g[f"{q}_moved"]] if f"{q}_moved" in g else g.iloc[:0]
                ax.scatter(moved["order"], moved[q], s=55, facecolors="none", edgecolors=color, linewidths=1.0,
                           zorder=3)
                if ax is axes[0]:
                    handles.append(h)
                    names.append(row_label(method, acceptance, lossy))
            where = f"{benchmark}" if benchmark else "mean over benchmarks"
            ax.set_ylabel(f"{title}\n({where})")
            ax.grid(axis="x", visible=False)
        axes[-1].set_xticks(np.arange(len(labels)), labels, rotation=45 if len(labels) > 4 else 0,
                            ha="right" if len(labels) > 4 else "center", rotation_mode="anchor")
        axes[-1].set_xlabel("Commit, oldest first (* = uncommitted changes)")
        legend_above(fig, handles, names)
        ring = (f"ringed: moved more than {100 * tolerance:g}% from the method's previous commit; "
                if tolerance is not None else "ringed: moved beyond the tolerance from the method's previous commit; ")
        caption(fig, (f"{setting} · " if setting else "") + "from results/history.jsonl (`compare --record`, "
                "scripts/backfill_history.py); " + ring + "no intervals (greedy τ is deterministic on CPU)",
                COLUMN_WIDTH_IN * (2 if wide else 1))
        return save_figure(fig, Path(out), name)


# ----------------------------------------------------------------------------- training

def plot_training_curves(frame: pd.DataFrame, out: Path, name: str = "training-curves") -> list[Path]:
    """Held-out top-1 against optimiser step (from `training_curves.read_curves`): one panel per
    method, one line per predicted depth (darker = nearer), checkpoints of one method told apart by
    line style; each panel's legend at its right."""
    from matplotlib.lines import Line2D

    methods = sorted(dict.fromkeys(frame["method"]), key=lambda m: method_display(m).order)
    with agg_context():
        fig = new_figure(0.45 + 1.35 * len(methods))
        axes = fig.subplots(len(methods), 1, squeeze=False, sharex=True)[:, 0]
        for ax, method in zip(axes, methods):
            g = frame[frame["method"] == method]
            ckpts = list(dict.fromkeys(g["checkpoint"]))
            metrics = list(dict.fromkeys(g["metric"]))
            for k, ckpt in enumerate(ckpts):
                for i, metric in enumerate(metrics):
                    m = g[(g["checkpoint"] == ckpt) & (g["metric"] == metric)]
                    if len(m):
                        ax.plot(m["step"], m["top1"], color=shade(method_color(method), i, len(metrics)),
                                linestyle=LINESTYLES[k % len(LINESTYLES)], marker="o" if k == 0 else None,
                                markersize=2, linewidth=1.0)
            handles = [Line2D([], [], color=shade(method_color(method), i, len(metrics)), linewidth=1.5)
                       for i in range(len(metrics))]
            labels = list(metrics)
            if len(ckpts) > 1:
                handles += [Line2D([], [], color="#555555", linestyle=LINESTYLES[k % len(LINESTYLES)], linewidth=1.0)
                            for k in range(len(ckpts))]
                labels += ckpts
            ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=5.5,
                      handlelength=1.8)
            ax.set_title(display_label(method), loc="left", color=method_color(method), fontweight="bold", pad=2)
            ax.set_ylabel("Held-out top-1")
        axes[-1].set_xlabel("Optimiser step")
        targets = sorted({str(t) for t in frame.get("target", pd.Series(dtype=object)).dropna()})
        caption(fig, (f"Target {', '.join(targets)} · " if targets else "") + "held-out top-1: teacher-forced "
                "agreement with the target's next tokens on the held-out split, per predicted depth; one "
                "evaluation per point, no intervals")
        return save_figure(fig, Path(out), name)
