"""The τ history across commits: one line per cell of a run (commit, date, config hash, τ,
depth-1 acceptance, speedup, CPU kind, the prompts' digest) in `results/history.jsonl`.

- `history_lines` / `record_history(run_dir, file)`: a run's cells (harness/runs/regress.py's
  `run_cells` and `provenance`) as history lines, appended (`cli.py compare --record`);
  scripts/backfill_history.py fills the file from git history.
- `history_frame` reads it back, per (commit, method, acceptance), with the commits where a
  method's τ or depth-1 acceptance moved beyond a tolerance (`mark_moves`, `history_moves`);
  harness/report/plots.py draws it (`cli.py history`).
Seconds (speedup) are there for the record, never for a verdict.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness.core.errors import SpecbenchError
from harness.core.files import write_atomic
from harness.core.paths import REPO_ROOT
from harness.runs.folder_lock import hold
from harness.runs.record import is_lossy
from harness.runs.regress import DEFAULT_TOLERANCE, EPS, machine, provenance, run_cells
from harness.runs.results import refuse_dirty
from harness.runs.run_data import RunData, fmt_temperature, load_run, row_label

HISTORY_FILE = REPO_ROOT / "results" / "history.jsonl"


def history_lines(run: RunData, commit: str | None, dirty: bool | None, date: str,
                  **extra: Any) -> list[dict[str, Any]]:
    """One history line per cell of `run`, attributed to `commit` at `date`: τ, depth-1
    acceptance, speedup, the CPU kind and the prompts' digest (a change of prompts shows as one,
    never as a move of τ); `extra` keys (e.g. source="backfill") go on every line."""
    prov = provenance(run)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = []
    for c in run_cells(run):
        lines.append({
            "commit": commit, "dirty": dirty, "date": date, "recorded": now,
            "run_config_hash": run.meta.get("config_hash"), "config_hash": c["config_hash"],
            "target": prov["target"], "dtype": prov["dtype"], "device": prov["device"],
            "max_new_tokens": prov["max_new_tokens"], "method": c["method"], "benchmark": c["benchmark"],
            "temperature": c["temperature"], "acceptance": c["acceptance"], "lossy": c["lossy"], "answers": c["answers"],
            "tau": round(c["tau"], 6), "depth1": (c["per_depth"] or [0.0])[0],
            "speedup": None if c["speedup"] is None else round(c["speedup"], 6),
            "cpu_kind": machine(prov), "prompts": prov["prompts"][c["benchmark"]]["digest"], **extra,
        })
    return lines


def append_lines(file: Path, lines: list[dict[str, Any]]) -> None:
    """Add JSON lines at the end of the history file: the file is rewritten whole through a
    temporary file, so a kill or a full disk leaves it as it was or with every line of the batch."""
    file = Path(file)
    old = file.read_bytes() if file.exists() else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    new = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
    write_atomic(file, old + new.encode("utf-8"))


def record_history(run_dir: Path, file: Path = HISTORY_FILE, allow_dirty: bool = False) -> int:
    """Append one line per cell of the run to the history file (its folder held meanwhile);
    returns the number of lines."""
    run = load_run(run_dir)
    refuse_dirty(run.meta, "--record", allow_dirty)
    meta = run.meta
    lines = history_lines(run, meta.get("commit"), meta.get("dirty"),
                          meta.get("date") or datetime.now(timezone.utc).isoformat(timespec="seconds"))
    with hold(Path(file).parent, "--history folder"):
        append_lines(file, lines)
    return len(lines)


def read_history(file: Path = HISTORY_FILE) -> list[dict[str, Any]]:
    """Every line of the history file (cells and the backfill's skipped-commit notes)."""
    file = Path(file)
    if not file.exists():
        raise SpecbenchError(f"no history at {file}: `cli.py compare --record` appends to it")
    rows = []
    for i, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SpecbenchError(f"{file}:{i}: malformed line ({e})") from None
    return rows


def history_frame(file: Path = HISTORY_FILE, target: str | None = None, dtype: str | None = None,
                  temperature: float = 0.0, benchmark: str | None = None, max_new_tokens: int | None = None,
                  tolerance: float = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """τ and depth-1 acceptance per (commit, method, acceptance): the mean over benchmarks (or
    `benchmark`'s) of the latest line per cell and commit, and whether the rule is lossy; commits
    in order of their first date. `target`, `dtype` and `max_new_tokens` default to the latest
    line's. `tau_change` / `depth1_change` are relative to the method's previous commit in the
    frame, and `tau_moved` / `depth1_moved` say whether that change is beyond `tolerance`."""
    rows = [r for r in read_history(file) if not r.get("skipped")]
    if not rows:
        raise SpecbenchError(f"{file} holds no cells")
    df = pd.DataFrame(rows).assign(lossy=[is_lossy(r) for r in rows])
    if "depth1" not in df:
        df["depth1"] = math.nan  # lines written before depth-1 acceptance was recorded
    target = target or df["target"].iloc[-1]
    dtype = dtype or df["dtype"].iloc[-1]
    max_new_tokens = max_new_tokens or df["max_new_tokens"].iloc[-1]
    df = df[(df["target"] == target) & (df["dtype"] == dtype) & (df["max_new_tokens"] == max_new_tokens)
            & (df["temperature"].astype(float) == temperature)]
    if benchmark:
        df = df[df["benchmark"] == benchmark]
    if df.empty:
        raise SpecbenchError(f"{file} has no lines for target {target}, dtype {dtype}, {max_new_tokens} tokens, "
                             f"T={fmt_temperature(temperature)}" + (f", benchmark {benchmark}" if benchmark else ""))
    df = df.assign(commit=df["commit"].fillna("unknown"))
    order = df.groupby("commit", sort=False)["date"].min().sort_values(kind="stable")  # ties: file order
    latest = df.drop_duplicates(["commit", "method", "acceptance", "benchmark"], keep="last")
    out = latest.groupby(["commit", "method", "acceptance"], sort=False).agg(
        tau=("tau", "mean"), depth1=("depth1", "mean"), benchmarks=("benchmark", "nunique"),
        dirty=("dirty", "max"), lossy=("lossy", "max")).reset_index()
    out["order"] = out["commit"].map({c: i for i, c in enumerate(order.index)})
    out["label"] = [row_label(m, a, lossy) for m, a, lossy in zip(out["method"], out["acceptance"], out["lossy"])]
    out = out.assign(target=target, dtype=dtype, max_new_tokens=max_new_tokens)  # what the frame holds, for captions
    from methods.registry import method_info  # lazy: the declared table order of each method

    out["rank"] = [method_info(m).order for m in out["method"]]
    out = out.sort_values(["order", "rank", "method", "acceptance"]).reset_index(drop=True)
    return mark_moves(out, tolerance)


def mark_moves(frame: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Add `<q>_change` and `<q>_moved` for q in τ and depth-1 acceptance: the relative change
    from the same (method, acceptance)'s previous commit in the frame, and |change| > tolerance.
    A method's first commit has no change (NaN, not moved)."""
    frame = frame.copy()
    for q in ("tau", "depth1"):
        prev = frame.groupby(["method", "acceptance"], sort=False)[q].shift()
        change = frame[q] / prev - 1
        frame[f"{q}_prev"] = prev
        frame[f"{q}_change"] = change
        frame[f"{q}_moved"] = (change.abs() > tolerance + EPS).astype(bool)
    return frame


def history_moves(frame: pd.DataFrame) -> list[str]:
    """One line per (commit, method) of a `history_frame` whose τ or depth-1 acceptance moved:
    'e8521a1 eagle: τ 1.6000 -> 1.8000 (+12.5%); depth 1 0.400 -> 0.450 (+12.5%)'."""
    out = []
    for _, r in frame[frame["tau_moved"] | frame["depth1_moved"]].iterrows():
        parts = [f"{name} {r[q + '_prev']:.{digits}f} -> {r[q]:.{digits}f} ({100 * r[q + '_change']:+.1f}%)"
                 for q, name, digits in (("tau", "τ", 4), ("depth1", "depth 1", 3)) if r[q + "_moved"]]
        out.append(f"{str(r['commit'])[:7]} {r['label']}: {'; '.join(parts)}")
    return out
