"""The cells of a run's tables: τ and speedup of one row on one column (a benchmark, a prompt
file's category, a turn) with their 95% bootstrap intervals, and the Mean over the columns.

Per (row, column), from the named metrics of harness/runs/metrics.py:
- τ (`TAU`) and speedup (`SPEEDUP`, each answer with AR's answer to the same prompt), each with a
  percentile bootstrap over answers (`RatioOfSums.replicates`), seeded from the cell's identity so
  a rebuild gives identical files;
- tokens per verify (`TOKENS_PER_VERIFY`): draft tokens the target verified per step, pooled over
  the answers: the budget a row ran at;
- the Mean: the arithmetic mean of the row's per-column τ (or speedup) values, each column weighing
  the same whatever its answer count (as the EAGLE / Gumiho papers compute it); its interval
  averages independent resamples of every column (`MEAN_DEFINITION` says so in every table).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.runs.metrics import N_BOOTSTRAP, SPEEDUP, TAU, TOKENS_PER_VERIFY, ByPrompt, ar_by_prompt, column_sums, interval
from harness.runs.record import Record
from harness.runs.run_data import MEAN, Row, RunData

# What the Mean column is, for every caption; {column}: "benchmark" (or "category" for prompt-file tables).
MEAN_DEFINITION = ("Mean: the arithmetic mean of the row's per-{column} values (each {column} weighs the same, "
                   "whatever its answers' number or length); its interval averages independent bootstrap "
                   "resamples of each {column}.")


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


def main_cells(run: RunData, resamples: int = N_BOOTSTRAP) -> dict[Row, dict[str, Cell]]:
    """{row: {benchmark | "mean": Cell}} for every non-AR row."""
    ar = ar_by_prompt(run.records)
    out: dict[Row, dict[str, Cell]] = {}
    for row in run.rows:
        cells = {b: cell_stats(run.row_records(row, b), ar, _cell_id(row, b), resamples) for b in run.benchmarks}
        cells[MEAN] = mean_cell([cells[b] for b in run.benchmarks])
        out[row] = cells
    return out


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
