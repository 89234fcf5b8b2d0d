"""A run folder's statistics, computed once: the numbers its tables, plots and regression baselines
show, rebuilt from `records.jsonl` and `meta.json` alone.

Rows are (temperature, method or ablation variant, acceptance rule); AR is the reference every
speedup is measured against and appears only in the cost frame. Per (row, benchmark):
- τ and speedup from `metrics.AnswerSums`, the computation summary.csv takes its numbers from;
- 95% intervals: percentile bootstrap over answers (prompts, for speedup: each resample keeps a
  method answer with AR's answer to the same prompt), `N_BOOTSTRAP` resamples seeded from the
  cell's identity, so a rebuild gives identical files;
- the Mean: the arithmetic mean of the row's per-benchmark τ (or speedup) values, each benchmark
  weighing the same whatever its answer count (as the EAGLE / Gumiho papers compute it); its
  interval resamples every benchmark independently and averages (`MEAN_DEFINITION` says so in
  every table);
- tokens per verify: draft tokens the target verified per step (tree nodes under the root),
  pooled over the answers (the Mean column pools all the row's answers): the budget a row ran at.
`compute_stats` does all of it once (the bootstrap included); tables and plots only render it.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.errors import SpecbenchError
from harness.core.hardware import cpu_kind
from harness.runs.metrics import (
    AR_METHOD,
    AnswerSums,
    ar_by_prompt,
    attach_divergences,
    dedupe,
    own_divergences,
    per_depth_acceptance,
    tokens_and_steps,
)
from harness.runs.results import RunDir
from methods.registry import method_info

N_BOOTSTRAP = 2000
CI_LEVEL = 0.95
MEAN = "mean"
# What the Mean column is, for every caption; {column}: "benchmark" (or "category" for prompt-file tables).
MEAN_DEFINITION = ("Mean: the arithmetic mean of the row's per-{column} values (each {column} weighs the same, "
                   "whatever its answers' number or length); its interval averages independent bootstrap "
                   "resamples of each {column}.")


def is_lossy(rec: Mapping[str, Any]) -> bool:
    """Whether a record's acceptance rule is lossy, as the runner wrote it (`"lossy"`).

    Records written before the runner stored it (the committed reference runs, the history lines
    of `cli.py compare --record` before it) fall back to the one lossy rule of that time, typical.
    """
    if "lossy" in rec:
        return bool(rec["lossy"])
    return rec.get("acceptance") == "typical"


def fmt_temperature(t: float) -> str:
    return f"{t:g}"


def display_label(name: str, method: str | None = None) -> str:
    """`name` (a method, `method [hash]`, or an ablation variant's label) as tables and plots print
    it: a method's declared display name (methods.registry.method_info), a variant's own label."""
    method = method or name
    shown = method_info(method).display_name
    if name == method:
        return shown
    if name.startswith(f"{method} ["):  # one method under several unlabelled configs
        return shown + name[len(method):]
    return name


def row_label(name: str, acceptance: str, lossy: bool, method: str | None = None) -> str:
    """How a row is named in every table and plot: the display name; lossy rows say so."""
    shown = display_label(name, method)
    return f"{shown} ({acceptance}, lossy)" if lossy else shown


# ----------------------------------------------------------------------------- loading

@dataclass(frozen=True)
class Row:
    """One table row: a method (or ablation variant) at one temperature under one acceptance rule."""

    temperature: float
    method: str
    config_hash: str
    acceptance: str
    name: str  # method name, or the variant's label in an ablation
    lossy: bool = False

    @property
    def label(self) -> str:
        return row_label(self.name, self.acceptance, self.lossy, self.method)


@dataclass
class RunData:
    path: Path
    records: list[dict]
    meta: dict
    benchmarks: list[str]
    rows: list[Row]        # AR excluded; temperature ascending, then the run's method order
    ar_rows: list[Row]
    parameters: dict[str, int]  # config hash -> drafter parameters (meta.json)
    ablation: dict | None = None
    _by_row: dict[Row, list[dict]] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        """Benchmarks, then the Mean (left out when there is a single benchmark)."""
        return [*self.benchmarks, MEAN] if len(self.benchmarks) > 1 else list(self.benchmarks)

    @property
    def temperatures(self) -> list[float]:
        return sorted({r.temperature for r in self.rows + self.ar_rows})

    def row_records(self, row: Row, benchmark: str | None = None) -> list[dict]:
        recs = self._by_row.get(row, [])
        return recs if benchmark is None else [r for r in recs if r["benchmark"] == benchmark]

    def setting(self) -> tuple[str, str, str]:
        """(target, dtype, machine) the records were measured with, from the records and meta.json:
        the machine is the GPU's name, else the CPU kind (derived from the CPU model and flags for
        folders written before meta.json stored it) and the torch threads."""
        def values(key: str) -> str:
            found = dict.fromkeys(str(r[key]) for r in self.records if r.get(key))
            return ", ".join(found) or str(self.meta.get("config", {}).get(key) or "?")

        meta = self.meta
        if meta.get("gpu"):
            machine = str(meta["gpu"])
        else:
            machine = meta.get("cpu_kind") or (cpu_kind(meta.get("cpu_model") or "", meta["cpu_flags"])
                                               if meta.get("cpu_flags") else meta.get("cpu_model")) or "CPU not recorded"
            threads = meta.get("torch_threads")
            if threads:
                machine += f", {threads} thread{'s' if threads != 1 else ''}"
        return values("target"), values("dtype"), machine

    def multi_variant(self) -> bool:
        """True when one method appears in several configs (an ablation): colour by variant."""
        configs: dict[str, set[str]] = {}
        for r in self.rows:
            configs.setdefault(r.method, set()).add(r.config_hash)
        return any(len(c) > 1 for c in configs.values())


def _row_of(rec: dict, names: dict[str, str]) -> Row:
    chash = rec.get("config_hash") or ""
    return Row(float(rec["temperature"]), rec["method"], chash, rec["acceptance"],
               names.get(chash, rec["method"]), is_lossy(rec))


def load_run(path: Path) -> RunData:
    """Records (deduplicated by key) and meta of a run folder, with its rows in table order."""
    rd = RunDir(Path(path))
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    meta = rd.read_meta() or {}
    records = attach_divergences(dedupe(rd.records()))
    if not records:
        raise SpecbenchError(f"{rd.records_path} holds no records yet")
    config = meta.get("config", {})
    resolved = config.get("methods_resolved") or {}
    # Names by config hash: the method, or the variant label that keyed it in meta.json.
    names: dict[str, str] = {}
    parameters: dict[str, int] = {}
    for label, entry in resolved.items():
        if isinstance(entry, dict) and entry.get("config_hash"):
            names[entry["config_hash"]] = label
            parameters[entry["config_hash"]] = int(entry.get("parameters") or 0)
    # The same method name under several unlabelled configs: tell them apart by hash.
    hashes_per_method: dict[str, set[str]] = {}
    for rec in records:
        hashes_per_method.setdefault(rec["method"], set()).add(rec.get("config_hash") or "")
    for rec in records:
        chash = rec.get("config_hash") or ""
        if chash not in names and len(hashes_per_method[rec["method"]]) > 1:
            names[chash] = f"{rec['method']} [{chash[:6]}]"

    by_row: dict[Row, list[dict]] = {}
    for rec in records:
        by_row.setdefault(_row_of(rec, names), []).append(rec)
    label_order = {label: i for i, label in enumerate(resolved)}
    first_seen = {}
    for rec in records:
        first_seen.setdefault(_row_of(rec, names).name, len(first_seen))
    accept_seen = {}
    for rec in records:
        accept_seen.setdefault(rec["acceptance"], len(accept_seen))

    def order(row: Row) -> tuple:  # methods in their declared order; a method's variants as the run listed them
        return (row.temperature, method_info(row.method).order,
                label_order.get(row.name, len(label_order) + first_seen[row.name]), accept_seen[row.acceptance])

    rows = sorted((r for r in by_row if r.method != AR_METHOD), key=order)
    ar_rows = sorted((r for r in by_row if r.method == AR_METHOD), key=order)
    present = list(dict.fromkeys(r["benchmark"] for r in records))
    wanted = [b for b in config.get("benchmarks", []) if b in present]
    benchmarks = wanted + [b for b in present if b not in wanted]
    return RunData(Path(path), records, meta, benchmarks, rows, ar_rows, parameters,
                   config.get("ablation"), by_row)


# ----------------------------------------------------------------------------- cells

def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def _weights(n: int, seed: int, resamples: int) -> np.ndarray:
    """[resamples, n] counts of each answer in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)


def _interval(reps: np.ndarray | None) -> tuple[float, float]:
    if reps is None or not np.isfinite(reps).any():
        return math.nan, math.nan
    lo, hi = np.nanpercentile(reps, [50 * (1 - CI_LEVEL), 100 - 50 * (1 - CI_LEVEL)])
    return float(lo), float(hi)


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
        return _interval(self.tau_reps)

    @property
    def speedup_ci(self) -> tuple[float, float]:
        return _interval(self.speedup_reps)


def cell_stats(recs: list[dict], ar: dict[tuple, list[dict]], seed_parts: Sequence[Any],
               resamples: int = N_BOOTSTRAP) -> Cell:
    """τ and speedup of one (row, benchmark) with `resamples` bootstrap replicates (0: none)."""
    if not recs:
        return Cell(0, math.nan, math.nan, None, None)
    draft_tokens, steps = _verified(recs)
    sums = AnswerSums.of(recs, ar)
    tau = float(sums.tau())
    tau_reps = sums.tau(_weights(len(recs), _seed("tau", *seed_parts), resamples)) if resamples else None
    speedup, speedup_reps = math.nan, None
    if len(sums.pairs):
        speedup = float(sums.speedup())
        if resamples:
            speedup_reps = sums.speedup(_weights(len(sums.pairs), _seed("speedup", *seed_parts), resamples))
    return Cell(len(recs), tau, speedup, tau_reps, speedup_reps, draft_tokens, steps)


def _verified(recs: list[dict]) -> tuple[float, int]:
    """(Σ draft tokens verified, Σ verify steps) over `recs`."""
    return (float(sum(sum((r.get("steps") or {}).get("tree_size", [])) for r in recs)),
            sum(tokens_and_steps(r)[1] for r in recs))


def _mean_cell(cells: list[Cell]) -> Cell:
    """Mean over benchmarks (NaN unless every benchmark has a value) with its bootstrap interval;
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


def main_cells(run: RunData, resamples: int = N_BOOTSTRAP) -> dict[Row, dict[str, Cell]]:
    """{row: {benchmark | "mean": Cell}} for every non-AR row."""
    ar = ar_by_prompt(run.records)
    out: dict[Row, dict[str, Cell]] = {}
    for row in run.rows:
        cells = {}
        for b in run.benchmarks:
            cells[b] = cell_stats(run.row_records(row, b), ar,
                                  (row.temperature, row.method, row.config_hash, row.acceptance, b), resamples)
        cells[MEAN] = _mean_cell([cells[b] for b in run.benchmarks])
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
        if rec.get("prompt_sha256"):
            names = cats.setdefault(rec["benchmark"], [])
            if rec.get("category", "") not in names:
                names.append(rec.get("category", ""))
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
            recs = [r for r in run.row_records(row, bench) if r.get("category", "") == cat]
            by_col[col] = cell_stats(recs, ar, (row.temperature, row.method, row.config_hash, row.acceptance, col),
                                     resamples)
        if MEAN in columns:
            by_col[MEAN] = _mean_cell(list(by_col.values()))
        out[row] = by_col
    return ColumnCells(columns, titles, out)


# ----------------------------------------------------------------------------- frames

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


def turn_cells(run: RunData, resamples: int = N_BOOTSTRAP) -> ColumnCells | None:
    """Per turn (columns `turn1`, `turn2`, ...), pooled over the benchmarks with more than one turn
    (MT-Bench). A later turn sees the earlier answers, which a lookup drafter can copy from, so the
    turns can rank methods differently. None when no benchmark has two turns."""
    turns_of: dict[str, set[int]] = {}
    for rec in run.records:
        turns_of.setdefault(rec["benchmark"], set()).add(int(rec["turn"]))
    multi = {b for b, t in turns_of.items() if len(t) > 1}
    if not multi:
        return None
    turns = sorted(set().union(*(turns_of[b] for b in multi)))
    columns = {f"turn{t + 1}": t for t in turns}
    ar = ar_by_prompt(run.records)
    out: dict[Row, dict[str, Cell]] = {}
    for row in run.rows:
        recs = [r for r in run.row_records(row) if r["benchmark"] in multi]
        out[row] = {col: cell_stats([r for r in recs if int(r["turn"]) == t], ar,
                                    (row.temperature, row.method, row.config_hash, row.acceptance, "turn", t),
                                    resamples)
                    for col, t in columns.items()}
    return ColumnCells(list(columns), {col: f"Turn {t + 1}" for col, t in columns.items()}, out)


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
        pooled = _mean_cell(list(cells.values()))
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
        # [answers, 6]: tokens, verify steps, draft ms, verify ms, wall - prefill ms, draft tokens verified
        per = np.array([[*tokens_and_steps(r), sum((r.get("steps") or {}).get("draft_ms", [])),
                         sum((r.get("steps") or {}).get("verify_ms", [])),
                         1000.0 * (r["wall_s"] - r.get("prefill_s", 0.0)),
                         sum((r.get("steps") or {}).get("tree_size", []))] for r in recs], dtype=float).reshape(-1, 6)
        tokens, steps, draft, verify, decode, tree = per.sum(axis=0)
        parts = {"draft": draft, "verify": verify, "other": decode - draft - verify}
        reps = None
        if resamples and len(recs):
            w = _weights(len(recs), _seed("ms_per_token", row.temperature, row.method, row.config_hash,
                                          row.acceptance), resamples)
            sums = w @ per[:, [0, 4]]  # [resamples, 2]: tokens, decode ms
            with np.errstate(divide="ignore", invalid="ignore"):
                reps = np.where(sums[:, 0] > 0, sums[:, 1] / sums[:, 0], np.nan)
        lo, hi = _interval(reps)
        line = {**_row_fields(row), "answers": len(recs), "steps": int(steps)}
        line.update({f"{k}_ms_per_step": v / steps if steps else math.nan for k, v in parts.items()})
        line.update({"tokens_per_verify": tree / steps if steps else math.nan,
                     "tau": tokens / steps if steps else math.nan,
                     "ms_per_token": decode / tokens if tokens else math.nan, "ms_per_token_lo": lo,
                     "ms_per_token_hi": hi})
        line.update({f"{k}_ms_per_token": v / tokens if tokens else math.nan for k, v in parts.items()})
        line.update({
            "prefill_ms_per_answer": 1000.0 * sum(r.get("prefill_s", 0.0) for r in recs) / len(recs) if recs else math.nan,
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
        draft_tokens, steps = _verified(recs)
        line = {**_row_fields(row), "steps": sum(len((r.get("steps") or {}).get("accepted", [])) for r in recs),
                "tokens_per_verify": round(draft_tokens / steps, 3) if steps else math.nan}
        for d in range(1, depth + 1):
            line[f"d{d}"] = round(curve[d - 1], 4) if d <= len(curve) else math.nan
        lines.append(line)
    return pd.DataFrame(lines)


# ----------------------------------------------------------------------------- all of it, once

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
