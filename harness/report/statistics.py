"""A run folder's statistics, computed once: the cells and the frames its tables, plots and README
show, rebuilt from `records.jsonl` and `meta.json` alone (`compute_stats` of `load_run`).

The cells: τ and speedup of one row on one column (a benchmark, a prompt file's category, a turn)
with their 95% bootstrap intervals, and the Mean over the columns. Per (row, column), from the
named metrics of harness/runs/metrics.py:
- τ (`TAU`) and speedup (`SPEEDUP`, each answer with AR's answer to the same prompt), each with a
  percentile bootstrap over answers (`RatioOfSums.replicates`), seeded from the cell's identity so
  a rebuild gives identical files;
- tokens per verify (`TOKENS_PER_VERIFY`): draft tokens the target verified per step, pooled over
  the answers: the budget a row ran at;
- the Mean: the arithmetic mean of the row's per-column τ (or speedup) values, each column weighing
  the same whatever its answer count (as the EAGLE / Gumiho papers compute it); its interval
  averages independent resamples of every column (`MEAN_DEFINITION` says so in every table).

The frames, laid out from the cells and the records:
- `main`: one line per (row, benchmark or Mean) with the estimates and 95% intervals;
- `cost`: per row, ms per verify step and per generated token (drafting, verifying, the rest),
  with the bootstrap interval of the total;
- `depth`: per row, the share of verify steps whose accepted path reached each depth;
- `turns`: per row, τ and speedup of each turn of the multi-turn benchmarks.
`compute_stats` does all of it once (the bootstrap included); tables and plots only render it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.runs.metrics import (
    N_BOOTSTRAP,
    SPEEDUP,
    TAU,
    TOKENS_PER_VERIFY,
    ByPrompt,
    ar_by_prompt,
    bootstrap_weights,
    column_sums,
    interval,
    own_divergences,
    per_depth_acceptance,
    seed_of,
    tokens_and_steps,
)
from harness.runs.record import AR_METHOD, Record
from harness.runs.run_data import MEAN, Row, RunData

# What the Mean column is, for every caption; {column}: "benchmark" (or "category" for prompt-file tables).
MEAN_DEFINITION = ("Mean: the arithmetic mean of the row's per-{column} values (each {column} weighs the same, "
                   "whatever its answers' number or length); its interval averages independent bootstrap "
                   "resamples of each {column}.")


# ----------------------------------------------------------------------------- the cells

@dataclass
class Cell:
    answers: int
    tau: float
    speedup: float
    tau_reps: np.ndarray | None      # bootstrap replicates; None when not resampled
    speedup_reps: np.ndarray | None
    draft_tokens: float = 0.0        # Σ draft tokens verified (tree nodes under the root) over the answers
    steps: int = 0                   # Σ verify steps over the answers

    @property
    def tokens_per_verify(self) -> float:
        """Draft tokens the target verified per step, pooled over the cell's answers."""
        return self.draft_tokens / self.steps if self.steps else math.nan

    @property
    def tau_ci(self) -> tuple[float, float]:
        return interval(self.tau_reps)

    @property
    def speedup_ci(self) -> tuple[float, float]:
        return interval(self.speedup_reps)


def cell_stats(recs: list[Record], ar: ByPrompt, cell: Sequence[Any], resamples: int = N_BOOTSTRAP) -> Cell:
    """τ and speedup of one (row, column) `cell` with `resamples` bootstrap replicates (0: none)."""
    if not recs:
        return Cell(0, math.nan, math.nan, None, None)
    taus, pairs = TAU.rows(recs), SPEEDUP.rows(recs, ar)
    draft_tokens, steps = column_sums(TOKENS_PER_VERIFY.rows(recs))
    return Cell(len(recs), float(TAU.estimate(taus)), float(SPEEDUP.estimate(pairs)),
                TAU.replicates(taus, cell, resamples), SPEEDUP.replicates(pairs, cell, resamples),
                float(draft_tokens), int(steps))


def mean_cell(cells: list[Cell]) -> Cell:
    """Mean over columns (NaN unless every column has a value) with its bootstrap interval;
    tokens per verify pooled over all the cells' answers."""
    if not cells:
        return Cell(0, math.nan, math.nan, None, None)

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if all(np.isfinite(values)) else math.nan

    def mean_reps(reps: list[np.ndarray | None]) -> np.ndarray | None:
        return None if any(r is None for r in reps) else np.mean(np.stack(reps), axis=0)

    return Cell(sum(c.answers for c in cells), mean([c.tau for c in cells]), mean([c.speedup for c in cells]),
                mean_reps([c.tau_reps for c in cells]), mean_reps([c.speedup_reps for c in cells]),
                sum(c.draft_tokens for c in cells), sum(c.steps for c in cells))


def _cell_id(row: Row, *column: Any) -> tuple:
    return (row.temperature, row.method, row.config_hash, row.acceptance, *column)


@dataclass
class ColumnCells:
    """Per row, τ and speedup over columns other than the benchmarks: the categories of a prompt
    file (Spec-Bench reports its own file this way) or the turns of multi-turn benchmarks.
    `titles` are what tables and plots print for the columns."""

    columns: list[str]
    titles: dict[str, str]
    cells: dict[Row, dict[str, Cell]]


def category_cells(run: RunData, resamples: int = N_BOOTSTRAP) -> ColumnCells | None:
    """Per category (columns `benchmark/category`, then their Mean), or None when no prompt file
    (records with `prompt_sha256`) has two categories. Built-in benchmarks are left out: their table
    is the main one."""
    cats: dict[str, list[str]] = {}
    for rec in run.records:
        if rec.prompt_sha256:
            names = cats.setdefault(rec.benchmark, [])
            if rec.category not in names:
                names.append(rec.category)
    cats = {b: sorted(c) for b, c in cats.items() if len(c) > 1}
    if not cats:
        return None
    columns = [f"{b}/{c}" for b in run.benchmarks if b in cats for c in cats[b]]
    titles = {col: (col.split("/", 1)[1] or "(none)") if len(cats) == 1 else col for col in columns}
    if len(columns) > 1:
        columns.append(MEAN)
        titles[MEAN] = "Mean"
    ar = ar_by_prompt(run.records)
    out: dict[Row, dict[str, Cell]] = {}
    for row in run.rows:
        by_col = {}
        for col in (c for c in columns if c != MEAN):
            bench, cat = col.split("/", 1)
            recs = [r for r in run.row_records(row, bench) if r.category == cat]
            by_col[col] = cell_stats(recs, ar, _cell_id(row, col), resamples)
        if MEAN in columns:
            by_col[MEAN] = mean_cell(list(by_col.values()))
        out[row] = by_col
    return ColumnCells(columns, titles, out)


def turn_cells(run: RunData, resamples: int = N_BOOTSTRAP) -> ColumnCells | None:
    """Per turn (columns `turn1`, `turn2`, ...), pooled over the benchmarks with more than one turn
    (MT-Bench). A later turn sees the earlier answers, which a lookup drafter can copy from, so the
    turns can rank methods differently. None when no benchmark has two turns."""
    turns_of: dict[str, set[int]] = {}
    for rec in run.records:
        turns_of.setdefault(rec.benchmark, set()).add(rec.turn)
    multi = {b for b, t in turns_of.items() if len(t) > 1}
    if not multi:
        return None
    turns = sorted(set().union(*(turns_of[b] for b in multi)))
    columns = {f"turn{t + 1}": t for t in turns}
    ar = ar_by_prompt(run.records)
    out: dict[Row, dict[str, Cell]] = {}
    for row in run.rows:
        recs = [r for r in run.row_records(row) if r.benchmark in multi]
        out[row] = {col: cell_stats([r for r in recs if r.turn == t], ar, _cell_id(row, "turn", t), resamples)
                    for col, t in columns.items()}
    return ColumnCells(list(columns), {col: f"Turn {t + 1}" for col, t in columns.items()}, out)


# ----------------------------------------------------------------------------- the frames

def _row_fields(row: Row) -> dict[str, Any]:
    """The columns that identify a row in every per-row frame."""
    return {"temperature": row.temperature, "method": row.method, "variant": row.name,
            "departures": ", ".join(row.departures), "acceptance": row.acceptance, "lossy": row.lossy,
            "config_hash": row.config_hash}


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
    cells: dict[Row, dict[str, Cell]]    # {row: {benchmark | MEAN: Cell}}, every non-AR row
    curves: dict[Row, list[float]]       # depth_curves, unrounded (the depth plot draws them)
    main: pd.DataFrame
    cost: pd.DataFrame
    depth: pd.DataFrame
    turns: pd.DataFrame                  # turn_frame; empty when no benchmark has two turns
    categories: ColumnCells | None = None    # prompt files with several categories (Spec-Bench's table)
    turn_cells: ColumnCells | None = None    # multi-turn benchmarks, per turn (the turns plot)


def compute_stats(run: RunData, resamples: int = N_BOOTSTRAP) -> RunStats:
    """The statistics of a loaded run folder (`load_run`): what `cli.py table` and `cli.py plot` render.
    The main cells first: per row, one `cell_stats` per benchmark and their `mean_cell`."""
    ar = ar_by_prompt(run.records)
    cells = {}
    for row in run.rows:
        by_bench = {b: cell_stats(run.row_records(row, b), ar, _cell_id(row, b), resamples) for b in run.benchmarks}
        cells[row] = {**by_bench, MEAN: mean_cell(list(by_bench.values()))}
    curves = depth_curves(run)
    turns = turn_cells(run, resamples)
    return RunStats(run, cells, curves, main_frame(cells), cost_frame(run, resamples), depth_frame(run, curves),
                    turn_frame(turns), category_cells(run, resamples), turns)
