"""Paper-style tables of a run's statistics: markdown, booktabs LaTeX and CSV.

Layout as in the EAGLE / Gumiho papers: one block per temperature, a Speedup and a τ column per
benchmark, and a Mean column. Rows whose acceptance rule is lossy (typical) carry
"(typical, lossy)" and never take the bold "best" mark.

Files: `tables/{main,cost,depth}.{md,tex,csv}` (`ablation.*` instead of `main.*` for `cli.py
ablate` folders; `turns.*` where a benchmark has several turns). Only rendering happens here: the
numbers come precomputed in a `RunStats` (harness/runs/statistics.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from harness.core.errors import SpecbenchError
from harness.runs.statistics import (
    CI_LEVEL,
    MEAN,
    Cell,
    ColumnCells,
    Row,
    RunData,
    RunStats,
    fmt_temperature,
    main_frame,
    row_label,
)

NOTE = ("Speedup: tokens/s over plain decoding (AR) on the same prompts in the same run; "
        "τ: new tokens per verify step. ")


def benchmark_title(name: str) -> str:
    from harness.runs.benchmarks import BENCHMARKS

    if name == MEAN:
        return "Mean"
    return BENCHMARKS.get(name, {}).get("title", name)


def frame_label(rec: dict) -> str:
    """`Row.label` of a line of a per-row frame."""
    return row_label(rec["variant"], rec["acceptance"], rec["lossy"])


# ----------------------------------------------------------------------------- cells of text

def _num(x: float, digits: int = 2, suffix: str = "") -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.{digits}f}{suffix}"


def _params(n: int) -> str:
    if not n:
        return "–"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e3:
        return f"{n / 1e3:.0f} k"
    return str(n)


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        text = text.replace(a, b)
    return text.replace("τ", r"$\tau$").replace("×", r"$\times$").replace("–", "--")


def _block_title(t: float, rows: list[Row]) -> str:
    rules = sorted({r.acceptance for r in rows})
    return f"Temperature {fmt_temperature(t)} ({', '.join(rules)})"


def _md_table(header: list[str], lines: list[list[str]], align: str) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return out


# ----------------------------------------------------------------------------- main table

def _best(values: dict[Row, float], rows: list[Row]) -> set[Row]:
    """Rows holding the best (largest) value, among lossless rows; none when fewer than two compete."""
    finite = {r: v for r, v in values.items() if r in rows and not r.lossy and np.isfinite(v)}
    if len(finite) < 2:
        return set()
    top = max(finite.values())
    return {r for r, v in finite.items() if round(v, 2) == round(top, 2)}


def _main_lines(run: RunData, cells: dict[Row, dict[str, Cell]], rows: list[Row], ci: bool,
                bold: tuple[str, str], columns: list[str]) -> list[list[str]]:
    best = {(b, m): _best({r: getattr(cells[r][b], m) for r in rows}, rows)
            for b in columns for m in ("speedup", "tau")}
    lines = []
    for row in rows:
        line = [row.label]
        for b in columns:
            c = cells[row][b]
            for metric, suffix in (("speedup", "×"), ("tau", "")):
                value = getattr(c, metric)
                text = _num(value, 2, suffix)
                if ci and np.isfinite(value):
                    lo, hi = getattr(c, f"{metric}_ci")
                    text += f" [{_num(lo)}, {_num(hi)}]"
                if row in best[(b, metric)]:
                    text = f"{bold[0]}{text}{bold[1]}"
                line.append(text)
        lines.append(line)
    return lines


def main_markdown(run: RunData, cells: dict[Row, dict[str, Cell]], ci: bool = False,
                  row_title: str = "Method", columns: list[str] | None = None,
                  titles: dict[str, str] | None = None) -> str:
    """The paper-style table: a Speedup and a τ column per benchmark (or per `columns`, printed as
    `titles`), one block per temperature."""
    columns = run.columns if columns is None else columns
    title = (lambda c: titles[c]) if titles else benchmark_title
    header = [row_title]
    for b in columns:
        header += [f"{title(b)} Speedup", f"{title(b)} τ"]
    out = []
    for t in run.temperatures:
        rows = [r for r in run.rows if r.temperature == t]
        if not rows:
            continue
        out += [f"**{_block_title(t, rows)}**", ""]
        out += _md_table(header, _main_lines(run, cells, rows, ci, ("**", "**"), columns), "l" + "r" * (len(header) - 1))
        out.append("")
    answers = sorted({c.answers for by in cells.values() for b, c in by.items() if b != MEAN})
    note = NOTE + f"Answers per cell: {', '.join(map(str, answers))}."
    if ci:
        note += f" Brackets: {int(CI_LEVEL * 100)}% bootstrap interval over answers."
    out.append(note)
    return "\n".join(out) + "\n"


def main_latex(run: RunData, cells: dict[Row, dict[str, Cell]], row_title: str = "Method",
               columns: list[str] | None = None, titles: dict[str, str] | None = None) -> str:
    columns = run.columns if columns is None else columns
    title = (lambda c: titles[c]) if titles else benchmark_title
    ncol = 1 + 2 * len(columns)
    out = ["% specbench table (rebuild: python cli.py table RUN_DIR); needs \\usepackage{booktabs}",
           "\\begin{tabular}{l" + "rr" * len(columns) + "}", "\\toprule",
           " & " + " & ".join(f"\\multicolumn{{2}}{{c}}{{{_tex_escape(title(b))}}}" for b in columns)
           + " \\\\",
           " ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(columns))),
           _tex_escape(row_title) + " & " + " & ".join(["Speedup & $\\tau$"] * len(columns)) + " \\\\"]
    for t in run.temperatures:
        rows = [r for r in run.rows if r.temperature == t]
        if not rows:
            continue
        out += ["\\midrule", f"\\multicolumn{{{ncol}}}{{l}}{{\\textit{{{_tex_escape(_block_title(t, rows))}}}}} \\\\"]
        for line in _main_lines(run, cells, rows, False, ("\x00", "\x01"), columns):
            cells_tex = [_tex_escape(x).replace("\x00", "\\textbf{").replace("\x01", "}") for x in line]
            out.append(" & ".join(cells_tex) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- per-row tables

def _grouped(frame: pd.DataFrame, render: Callable[[dict], list[str]], header: list[str], align: str,
             kind: str) -> str:
    """Markdown (kind 'md') or booktabs LaTeX ('tex') of a per-row frame, one block per temperature."""
    out: list[str] = []
    if kind == "tex":
        out += ["% specbench table (rebuild: python cli.py table RUN_DIR); needs \\usepackage{booktabs}",
                "\\begin{tabular}{" + align + "}", "\\toprule",
                " & ".join(_tex_escape(h) for h in header) + " \\\\"]
    for t, block in frame.groupby("temperature", sort=True):
        lines = [render(rec) for rec in block.to_dict("records")]
        rules = sorted(set(block["acceptance"]) - {"none"})
        title = f"Temperature {fmt_temperature(t)}" + (f" ({', '.join(rules)})" if rules else "")
        if kind == "md":
            out += [f"**{title}**", ""] + _md_table(header, lines, align) + [""]
        else:
            out += ["\\midrule", f"\\multicolumn{{{len(header)}}}{{l}}{{\\textit{{{_tex_escape(title)}}}}} \\\\"]
            out += [" & ".join(_tex_escape(x) for x in line) + " \\\\" for line in lines]
    if kind == "tex":
        out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out) + "\n"


def cost_text(frame: pd.DataFrame, kind: str) -> str:
    header = ["Method", "Draft ms/step", "Verify ms/step", "Other ms/step", "Tree size", "τ", "Draft params",
              "≠ AR"]

    def render(rec: dict) -> list[str]:
        mism = rec.get("mismatches", math.nan)
        return [frame_label(rec), _num(rec["draft_ms_per_step"]), _num(rec["verify_ms_per_step"]),
                _num(rec["other_ms_per_step"]), _num(rec["tree_size"], 1), _num(rec["tau"]),
                _params(int(rec["draft_parameters"])),
                "–" if mism is None or not np.isfinite(mism) else f"{int(mism)}/{int(rec['answers'])}"]

    text = _grouped(frame, render, header, "lrrrrrrr", kind)
    if kind == "md":
        text += ("Per verify step, pooled over benchmarks; other = wall - prefill - draft - verify "
                 "(sampling, cache updates, bookkeeping). Tree size: draft tokens verified per step. "
                 "≠ AR: greedy answers that differ from AR's.\n")
    return text


def depth_text(frame: pd.DataFrame, kind: str) -> str:
    depths = [c for c in frame.columns if c.startswith("d") and c[1:].isdigit()]
    header = ["Method", "Steps", *[f"d={c[1:]}" for c in depths]]

    def render(rec: dict) -> list[str]:
        return [frame_label(rec), str(int(rec["steps"])), *[_num(rec[c]) for c in depths]]

    text = _grouped(frame, render, header, "lr" + "r" * len(depths), kind)
    if kind == "md":
        text += "Share of verify steps whose accepted path reached depth d (pooled over benchmarks).\n"
    return text


def turn_text(frame: pd.DataFrame, kind: str) -> str:
    turns = sorted(int(c[4:-4]) for c in frame.columns if c.startswith("turn") and c.endswith("_tau"))
    header = ["Method", *[h for t in turns for h in (f"Turn {t} τ", f"Turn {t} speedup")]]

    def render(rec: dict) -> list[str]:
        return [frame_label(rec), *[x for t in turns for x in (_num(rec[f"turn{t}_tau"]),
                                                               _num(rec[f"turn{t}_speedup"], suffix="×"))]]

    text = _grouped(frame, render, header, "l" + "r" * (2 * len(turns)), kind)
    if kind == "md":
        text += ("Pooled over the multi-turn benchmarks; a later turn's prompt holds the earlier answers, "
                 "which lookup drafters can copy.\n")
    return text


# ----------------------------------------------------------------------------- files

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _csv(frame: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, lineterminator="\n")
    return path


def category_frame(cat: ColumnCells) -> pd.DataFrame:
    """Long form of the per-category table: one line per (row, category or mean)."""
    return main_frame(cat.cells).rename(columns={"benchmark": "category"})


def write_tables(stats: RunStats, ci: bool = False) -> list[Path]:
    """Write tables/main|cost|depth(.md/.tex/.csv), turns.* where a benchmark has several turns,
    categories.* where a prompt file has several categories,
    and ablation.* (instead of main.*) for an ablation folder; the main markdown first."""
    run = stats.run
    if not run.rows:
        raise SpecbenchError(f"{run.path} holds AR records only: nothing to compare")
    out = run.path / "tables"
    main = "ablation" if run.ablation else "main"
    title = "Variant" if run.ablation else "Method"
    paths = [
        _write(out / f"{main}.md", main_markdown(run, stats.cells, ci, title)),
        _write(out / f"{main}.tex", main_latex(run, stats.cells, title)),
        _csv(stats.main, out / f"{main}.csv"),
    ]
    if stats.categories is not None:
        cat = stats.categories
        paths += [_write(out / "categories.md", main_markdown(run, cat.cells, ci, title, cat.columns, cat.titles)),
                  _write(out / "categories.tex", main_latex(run, cat.cells, title, cat.columns, cat.titles)),
                  _csv(category_frame(cat), out / "categories.csv")]
    frames = [("cost", stats.cost, cost_text), ("depth", stats.depth, depth_text)]
    if not stats.turns.empty:
        frames.append(("turns", stats.turns, turn_text))
    for name, frame, text in frames:
        paths += [_write(out / f"{name}.md", text(frame, "md")), _write(out / f"{name}.tex", text(frame, "tex")),
                  _csv(frame, out / f"{name}.csv")]
    return paths
