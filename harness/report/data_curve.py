"""The data curve's table and plot: held-out top-1 and τ of learned drafters against the
answer tokens they were trained on (scripts/data_curve.py makes the points)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

COLUMNS = ["method", "decoded_as", "train_share", "train_tokens", "steps", "held_out_top1",
           "held_out_top1_step2", "tau", "answers", "mismatches", "checkpoint", "run"]


def curve_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (method, share), sorted by method and tokens."""
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.sort_values(["method", "train_share"], kind="stable").reset_index(drop=True)


def curve_markdown(frame: pd.DataFrame, settings: dict[str, Any]) -> str:
    """The table as markdown, with a caption that says what was measured."""
    from harness.runs.method_display import method_display

    lines = [f"Held-out top-1 (teacher-forced next token; step 2 = the drafter's own second step, EAGLE-3 only) "
             f"and τ ({settings.get('benchmark')} ×{settings.get('limit')}, {settings.get('max_new_tokens')} tokens, "
             f"{settings.get('dtype')}, greedy, tree budget {settings.get('tree_budget')}) against training answer "
             f"tokens; each point trains {settings.get('steps')} × share optimiser steps on that share of the "
             f"training conversations (equal passes over its data)"
             + ("; a share above 1 trains on more distilled folders besides (its checkpoint's config.json lists "
                "them), and every held-out top-1 is read on the 1× data's held-out split."
                if (frame["train_share"] > 1).any() else "."), "",
             "| drafter | decoded as | share | answer tokens | steps | held-out top-1 | step 2 | τ | answers (≠ AR) |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in frame.itertuples():
        step2 = "" if pd.isna(r.held_out_top1_step2) else f"{r.held_out_top1_step2:.3f}"
        lines.append(f"| {method_display(r.method).display_name} | {method_display(r.decoded_as).display_name} | "
                     f"{r.train_share:g} | {int(r.train_tokens):,} | {int(r.steps):,} | {r.held_out_top1:.3f} | "
                     f"{step2} | {r.tau:.2f} | {int(r.answers)} ({int(r.mismatches)}) |")
    return "\n".join(lines) + "\n"


def curve_plot(frame: pd.DataFrame, path: Path, caption: str) -> None:
    """Two panels against answer tokens (log scale): held-out top-1 and τ, one line per drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.runs.method_display import method_display

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for method, part in frame.groupby("method", sort=False):
        info = method_display(method)
        label = info.display_name if method == part["decoded_as"].iloc[0] else \
            f"{info.display_name} weights as {method_display(part['decoded_as'].iloc[0]).display_name}"
        for ax, column in zip(axes, ["held_out_top1", "tau"]):
            ax.plot(part["train_tokens"], part[column], marker="o", color=info.color, label=label)
    ticks = sorted(frame["train_tokens"].unique())
    for ax, title in zip(axes, ["held-out top-1 (next token)", "τ (tokens per verify step)"]):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t / 1000:,.0f} k" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("training answer tokens")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.text(0.01, 0.005, caption, fontsize=7, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def write_curve(rows: list[dict[str, Any]], out: Path, settings: dict[str, Any]) -> pd.DataFrame:
    """curve.csv, curve.md, curve.png and meta.json (settings, commit, machine) in `out`."""
    from harness.core.machine_meta import collect_meta

    out.mkdir(parents=True, exist_ok=True)
    frame = curve_table(rows)
    frame.to_csv(out / "curve.csv", index=False, float_format="%.4f")
    (out / "curve.md").write_text(curve_markdown(frame, settings))
    meta = {"settings": {k: v for k, v in settings.items() if k not in ("checkpoints", "out", "data_dir")},
            "machine": collect_meta()}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    hw = meta["machine"]
    caption = (f"{settings.get('target')}, decoding in {settings.get('dtype')} on {hw.get('cpu_kind', '?')}; "
               f"{settings.get('benchmark')} ×{settings.get('limit')}; command: python scripts/data_curve.py (see meta.json)")
    if len(frame):
        curve_plot(frame, out / "curve.png", caption)
    return frame
