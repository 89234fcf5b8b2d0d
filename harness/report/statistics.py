"""A run folder's statistics, computed once: the frames its tables, plots and README show, rebuilt
from `records.jsonl` and `meta.json` alone (`load_stats`).

The cells (τ and speedup per row and benchmark, with intervals) come from harness/report/cells.py,
every number from the named metrics of harness/runs/metrics.py; here they are laid out as frames:
- `main`: one line per (row, benchmark or Mean) with the estimates and 95% intervals;
- `cost`: per row, ms per verify step and per generated token (drafting, verifying, the rest),
  with the bootstrap interval of the total;
- `depth`: per row, the share of verify steps whose accepted path reached each depth;
- `turns`: per row, τ and speedup of each turn of the multi-turn benchmarks.
`compute_stats` does all of it once (the bootstrap included); tables and plots only render it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.report.cells import Cell, ColumnCells, category_cells, main_cells, mean_cell, turn_cells
from harness.runs.metrics import (
    N_BOOTSTRAP,
    TAU,
    TOKENS_PER_VERIFY,
    bootstrap_weights,
    interval,
    own_divergences,
    per_depth_acceptance,
    seed_of,
    tokens_and_steps,
)
from harness.runs.record import AR_METHOD
from harness.runs.run_data import Row, RunData, load_run


def _row_fields(row: Row) -> dict[str, Any]:
    """The columns that identify a row in every per-row frame."""
    return {"temperature": row.temperature, "method": row.method, "variant": row.name,
            "acceptance": row.acceptance, "lossy": row.lossy, "config_hash": row.config_hash}


def main_frame(cells: dict[Row, dict[str, Cell]]) -> pd.DataFrame:
    """Long form: one line per (row, benchmark or mean) with the estimates and 95% intervals."""
    lines = []
    for row, by_bench in cells.items():
        for b, c in by_bench.items():
            (tl, th), (sl, sh) = c.tau_ci, c.speedup_ci
            lines.append({**_row_fields(row), "benchmark": b, "answers": c.answers, "speedup": c.speedup,
                          "speedup_lo": sl, "speedup_hi": sh, "tau": c.tau, "tau_lo": tl, "tau_hi": th,
                          "tokens_per_verify": c.tokens_per_verify})
    return pd.DataFrame(lines).round({**{k: 4 for k in ("speedup", "speedup_lo", "speedup_hi", "tau", "tau_lo", "tau_hi")},
                                      "tokens_per_verify": 3})


def turn_frame(turns: ColumnCells | None) -> pd.DataFrame:
    """One line per row: answers, τ and speedup of each turn, and tokens per verify pooled over the
    turns (empty without multi-turn benchmarks)."""
    if turns is None:
        return pd.DataFrame()
    lines = []
    for row, cells in turns.cells.items():
        line = _row_fields(row)
        for col in turns.columns:
            cell = cells[col]
            line.update({f"{col}_answers": cell.answers, f"{col}_tau": round(cell.tau, 4),
                         f"{col}_speedup": round(cell.speedup, 4)})
        pooled = mean_cell(list(cells.values()))
        line["tokens_per_verify"] = round(pooled.tokens_per_verify, 3)
        lines.append(line)
    return pd.DataFrame(lines)


def cost_frame(run: RunData, resamples: int = N_BOOTSTRAP) -> pd.DataFrame:
    """Per (temperature, row), pooled over benchmarks: ms per verify step drafting, verifying and
    the rest (wall - prefill - draft - verify); the same per generated token (ms per step / τ =
    Σ ms / Σ tokens), the total with its bootstrap interval over answers; tokens per verify, τ and
    drafter parameters. AR first."""
    lines = []
    for row in sorted(run.ar_rows + run.rows, key=lambda r: (r.temperature, r.method != AR_METHOD)):
        recs = run.row_records(row)
        # [answers, 5]: tokens, verify steps, draft ms, verify ms, wall - prefill ms
        per = np.array([[*tokens_and_steps(r), sum(r.steps.draft_ms or []), sum(r.steps.verify_ms or []),
                         1000.0 * (r.wall_s - r.prefill_s)] for r in recs], dtype=float).reshape(-1, 5)
        tokens, steps, draft, verify, decode = per.sum(axis=0)
        parts = {"draft": draft, "verify": verify, "other": decode - draft - verify}
        reps = None
        if resamples and len(recs):
            w = bootstrap_weights(len(recs), seed_of("ms_per_token", row.temperature, row.method, row.config_hash,
                                                     row.acceptance), resamples)
            sums = w @ per[:, [0, 4]]  # [resamples, 2]: tokens, decode ms
            with np.errstate(divide="ignore", invalid="ignore"):
                reps = np.where(sums[:, 0] > 0, sums[:, 1] / sums[:, 0], np.nan)
        lo, hi = interval(reps)
        line = {**_row_fields(row), "answers": len(recs), "steps": int(steps)}
        line.update({f"{k}_ms_per_step": v / steps if steps else math.nan for k, v in parts.items()})
        line.update({"tokens_per_verify": TOKENS_PER_VERIFY.of(recs), "tau": TAU.of(recs),
                     "ms_per_token": decode / tokens if tokens else math.nan, "ms_per_token_lo": lo,
                     "ms_per_token_hi": hi})
        line.update({f"{k}_ms_per_token": v / tokens if tokens else math.nan for k, v in parts.items()})
        line.update({
            "prefill_ms_per_answer": 1000.0 * sum(r.prefill_s for r in recs) / len(recs) if recs else math.nan,
            "draft_parameters": run.parameters.get(row.config_hash, 0),
            # Greedy answers that left AR's output themselves; at T > 0 outputs are samples.
            "mismatches": (len(own_divergences(recs)) if row.temperature == 0 and row.method != AR_METHOD
                           else math.nan),
        })
        lines.append(line)
    ms = [c for c in lines[0] if c.startswith(("draft_ms", "verify_ms", "other_ms", "ms_per_token"))] if lines else []
    return pd.DataFrame(lines).round({**{c: 3 for c in ms}, "tokens_per_verify": 3, "tau": 4,
                                      "prefill_ms_per_answer": 2})


def depth_curves(run: RunData) -> dict[Row, list[float]]:
    """Per non-AR row, pooled over benchmarks: `per_depth_acceptance` (element 0 is depth 1)."""
    return {row: per_depth_acceptance(run.row_records(row)) for row in run.rows}


def depth_frame(run: RunData, curves: dict[Row, list[float]]) -> pd.DataFrame:
    """Per (temperature, row): for depth d, the share of verify steps whose accepted path reached d
    (columns d1, d2, ...; empty beyond the row's deepest acceptance)."""
    depth = max((len(c) for c in curves.values()), default=0)
    lines = []
    for row, curve in curves.items():
        recs = run.row_records(row)
        line = {**_row_fields(row), "steps": sum(len(r.steps.accepted or []) for r in recs),
                "tokens_per_verify": round(TOKENS_PER_VERIFY.of(recs), 3)}
        for d in range(1, depth + 1):
            line[f"d{d}"] = round(curve[d - 1], 4) if d <= len(curve) else math.nan
        lines.append(line)
    return pd.DataFrame(lines)


@dataclass
class RunStats:
    """Everything the tables and plots of a run show, computed once (the bootstrap included)."""

    run: RunData
    cells: dict[Row, dict[str, Cell]]    # main_cells
    curves: dict[Row, list[float]]       # depth_curves, unrounded (the depth plot draws them)
    main: pd.DataFrame
    cost: pd.DataFrame
    depth: pd.DataFrame
    turns: pd.DataFrame                  # turn_frame; empty when no benchmark has two turns
    categories: ColumnCells | None = None    # prompt files with several categories (Spec-Bench's table)
    turn_cells: ColumnCells | None = None    # multi-turn benchmarks, per turn (the turns plot)


def compute_stats(run: RunData, resamples: int = N_BOOTSTRAP) -> RunStats:
    cells = main_cells(run, resamples)
    curves = depth_curves(run)
    turns = turn_cells(run, resamples)
    return RunStats(run, cells, curves, main_frame(cells), cost_frame(run, resamples), depth_frame(run, curves),
                    turn_frame(turns), category_cells(run, resamples), turns)


def load_stats(run_dir: Path, resamples: int = N_BOOTSTRAP) -> RunStats:
    """`compute_stats` of a run folder: what `cli.py table` and `cli.py plot` render."""
    return compute_stats(load_run(run_dir), resamples)
