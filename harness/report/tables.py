"""Paper-style tables of a run's statistics: markdown, booktabs LaTeX and CSV.

Layout as in the EAGLE / Gumiho papers: one block per temperature, a Speedup and a τ column per
benchmark, a Mean column, and the row's Tokens/verify (the budget it ran at). Rows carry the
methods' display names (harness/runs/method_display.py); rows whose acceptance rule is lossy
(typical) carry "(typical, lossy)" and never compete for emphasis.

Emphasis is honest: a value is bold only when its 95% bootstrap interval clears every other lossless
row's; when the best's interval overlaps another's, the rows tied for best carry a dagger instead.
Every caption says what Speedup, τ, Mean, Tokens/verify and the marks are, and where the numbers
were measured.

Files: `tables/{main,cost,depth}.{md,tex,csv}` (`ablation.*` instead of `main.*` for `cli.py
ablate` folders; `turns.*` where a benchmark has several turns). Only rendering happens here: the
numbers come precomputed in a `RunStats` (harness/report/statistics.py).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from harness.core.errors import SpecbenchError
from harness.core.files import write_atomic
from harness.report.peers_table import write_peer_tables
from harness.report.statistics import MEAN_DEFINITION, Cell, ColumnCells, RunStats, main_frame
from harness.runs.metrics import CI_LEVEL
from harness.runs.run_data import MEAN, Row, RunData, fmt_temperature, row_label

NOTE = ("Speedup: tokens/s over plain decoding (AR) on the same prompts in the same run (Σ tokens / Σ seconds); "
        "τ: new tokens per verify step (bonus token included). ")
TOKENS_NOTE = ("Tokens/verify: draft tokens the target verified per step (tree nodes under the root), pooled over "
               "the row's answers: the budget the row ran at. ")
EMPHASIS_NOTE = (f"Bold: the best lossless value, its {int(CI_LEVEL * 100)}% bootstrap interval clear of every other "
                 "lossless row's; †: tied for best (the best's interval overlaps these rows'); lossy rows never "
                 "compete. ")
# Placeholders for emphasis, replaced per format once the cell text is escaped.
BOLD_OPEN, BOLD_CLOSE, DAGGER = "\x00", "\x01", "\x02"


def benchmark_title(name: str) -> str:
    from harness.runs.benchmarks import BENCHMARKS

    if name == MEAN:
        return "Mean"
    return BENCHMARKS.get(name, {}).get("title", name)


def frame_label(rec: dict) -> str:
    """`Row.label` of a line of a per-row frame."""
    departures = tuple(d for d in str(rec.get("departures") or "").split(", ") if d)
    return row_label(rec["variant"], rec["acceptance"], rec["lossy"], rec["method"], departures)


def setting_text(run: RunData) -> str:
    """Where the numbers come from, for every caption: target, dtype, machine, and how many
    invalid records were left out (--skip-invalid), if any."""
    target, dtype, machine = run.setting()
    machine = re.sub(r"\((R|TM)\)", "", machine).replace("  ", " ")
    skipped = f"; {run.skipped} invalid record{'s' if run.skipped != 1 else ''} left out (--skip-invalid)"
    return f"{target}, {dtype}, {machine}" + (skipped if run.skipped else "")


def answers_text(counts: list[int]) -> str:
    """'10' or '10–20': the answers behind each cell."""
    counts = sorted(set(counts))
    if not counts:
        return "0"
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"


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
    text = text.replace("τ", r"$\tau$").replace("×", r"$\times$").replace("–", "--").replace("≠", r"$\neq$")
    return text.replace("†", r"$^\dagger$").replace(BOLD_OPEN, r"\textbf{").replace(BOLD_CLOSE, "}").replace(
        DAGGER, r"$^\dagger$")


def _md_marks(text: str) -> str:
    return text.replace(BOLD_OPEN, "**").replace(BOLD_CLOSE, "**").replace(DAGGER, "†")


def _block_title(t: float, acceptance: Iterable[str]) -> str:
    """A temperature block's title with the acceptance rules of its rows (AR's "none" left out)."""
    rules = sorted(set(acceptance) - {"none"})
    return f"Temperature {fmt_temperature(t)}" + (f" ({', '.join(rules)})" if rules else "")


def _md_table(header: list[str], lines: list[list[str]], align: str) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return out


def _tex_caption(text: str) -> list[str]:
    """The markdown caption as LaTeX comment lines: the tabular goes inside the reader's own table."""
    words, lines, line = text.split(), [], "% Caption:"
    for w in words:
        if len(line) + len(w) > 98:
            lines.append(line)
            line = "%"
        line += " " + w
    return lines + [line]


def _layout(kind: str, header: list[str], align: str, blocks: list[tuple[str, list[list[str]]]], caption: str,
            tex_header: list[str] | None = None) -> str:
    """Every table's text: one block per (title, lines) under `header`, in markdown (`kind` 'md',
    the caption below) or booktabs LaTeX ('tex', the caption as comment lines above the tabular;
    `tex_header`: header lines other than `header` itself). Cell texts may hold the emphasis
    placeholders."""
    if kind == "md":
        out = []
        for title, lines in blocks:
            out += [f"**{title}**", ""] + _md_table(header, [[_md_marks(x) for x in line] for line in lines], align)
            out.append("")
        return "\n".join(out + [caption]) + "\n"
    out = ["% specbench table (rebuild: python cli.py table RUN_DIR); needs \\usepackage{booktabs}",
           *_tex_caption(caption), "\\begin{tabular}{" + align + "}", "\\toprule",
           *(tex_header or [" & ".join(_tex_escape(h) for h in header) + " \\\\"])]
    for title, lines in blocks:
        out += ["\\midrule", f"\\multicolumn{{{len(header)}}}{{l}}{{\\textit{{{_tex_escape(title)}}}}} \\\\"]
        out += [" & ".join(_tex_escape(x) for x in line) + " \\\\" for line in lines]
    return "\n".join(out + ["\\bottomrule", "\\end{tabular}"]) + "\n"


# ----------------------------------------------------------------------------- main table

def emphasis(cells: dict[Row, Cell], rows: list[Row], metric: str) -> dict[Row, str]:
    """{row: "best" | "tie"} for one column and metric ("speedup" or "tau"), among lossless rows.

    "best": the highest value, and its bootstrap interval overlaps no other row's; otherwise the
    highest value and every row whose interval overlaps its interval are "tie". A missing interval
    overlaps everything. Nothing is marked when fewer than two rows compete."""
    compete = {r: cells[r] for r in rows if not r.lossy and np.isfinite(getattr(cells[r], metric))}
    if len(compete) < 2:
        return {}
    best = max(compete, key=lambda r: getattr(compete[r], metric))
    lo, hi = getattr(compete[best], f"{metric}_ci")
    tied = [best]
    for row, cell in compete.items():
        rlo, rhi = getattr(cell, f"{metric}_ci")
        if row != best and not (np.isfinite([lo, hi, rlo, rhi]).all() and (rhi < lo or rlo > hi)):
            tied.append(row)
    return {best: "best"} if len(tied) == 1 else {r: "tie" for r in tied}


def _pooled_tokens_per_verify(by_column: dict[str, Cell], columns: list[str]) -> float:
    """Draft tokens verified per step over every answer of the row in `columns`."""
    cells = [by_column[c] for c in columns if c != MEAN]
    steps = sum(c.steps for c in cells)
    return sum(c.draft_tokens for c in cells) / steps if steps else math.nan


def main_caption(run: RunData, cells: dict[Row, dict[str, Cell]], columns: list[str], ci: bool) -> str:
    """What every number and mark of the main table means, and where it was measured."""
    answers = [c.answers for by in cells.values() for b, c in by.items() if b != MEAN]
    column = "benchmark" if all(c == MEAN or c in run.benchmarks for c in columns) else "column"
    note = NOTE + (MEAN_DEFINITION.format(column=column) + " " if MEAN in columns else "") + TOKENS_NOTE + EMPHASIS_NOTE
    note += f"Answers per cell: {answers_text(answers)}. Measured on {setting_text(run)}."
    if ci:
        note += f" Brackets: {int(CI_LEVEL * 100)}% bootstrap interval over answers."
    return note


def main_text(run: RunData, cells: dict[Row, dict[str, Cell]], kind: str, ci: bool = False,
              row_title: str = "Method", columns: list[str] | None = None,
              titles: dict[str, str] | None = None) -> str:
    """The paper-style table in markdown (`kind` 'md'; `ci`: intervals in brackets) or booktabs
    LaTeX ('tex'): a Speedup and a τ column per benchmark (or per `columns`, printed as `titles`),
    the row's Tokens/verify (pooled over the row's answers), one block per temperature, and the
    caption (below the markdown; comment lines above the tabular). Emphasis per column and metric:
    `emphasis`."""
    columns = run.columns if columns is None else columns
    title = (lambda c: titles[c]) if titles else benchmark_title
    ci = ci and kind == "md"
    header = [row_title, *[f"{title(b)} {m}" for b in columns for m in ("Speedup", "τ")], "Tokens/verify"]
    # LaTeX: a Speedup and a τ column under each benchmark's title.
    tex_header = [" & " + " & ".join(f"\\multicolumn{{2}}{{c}}{{{_tex_escape(title(b))}}}" for b in columns) + " & \\\\",
                  " ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(columns))),
                  _tex_escape(row_title) + " & " + " & ".join(["Speedup & $\\tau$"] * len(columns)) + " & Tokens/verify \\\\"]
    blocks = []
    for t in run.temperatures:
        rows = [r for r in run.rows if r.temperature == t]
        if not rows:
            continue
        marks = {(b, m): emphasis({r: cells[r][b] for r in rows}, rows, m) for b in columns for m in ("speedup", "tau")}
        lines = []
        for row in rows:
            line = [row.label]
            for b in columns:
                for metric, suffix in (("speedup", "×"), ("tau", "")):
                    value = getattr(cells[row][b], metric)
                    text = _num(value, 2, suffix)
                    if ci and np.isfinite(value):
                        lo, hi = getattr(cells[row][b], f"{metric}_ci")
                        text += f" [{_num(lo)}, {_num(hi)}]"
                    mark = marks[(b, metric)].get(row)
                    line.append(f"{BOLD_OPEN}{text}{BOLD_CLOSE}" if mark == "best" else
                                text + DAGGER if mark == "tie" else text)
            line.append(_num(_pooled_tokens_per_verify(cells[row], columns), 1))
            lines.append(line)
        blocks.append((_block_title(t, (r.acceptance for r in rows)), lines))
    return _layout(kind, header, "l" + "r" * (len(header) - 1), blocks, main_caption(run, cells, columns, ci), tex_header)


# ----------------------------------------------------------------------------- per-row tables

def _grouped(frame: pd.DataFrame, render: Callable[[dict], list[str]], header: list[str], align: str,
             kind: str, caption: str) -> str:
    """Markdown (kind 'md') or booktabs LaTeX ('tex') of a per-row frame, one block per temperature."""
    blocks = []
    for t, block in frame.groupby("temperature", sort=True):
        blocks.append((_block_title(t, block["acceptance"]), [render(rec) for rec in block.to_dict("records")]))
    return _layout(kind, header, align, blocks, caption)


def _interval_text(value: float, lo: float, hi: float) -> str:
    return _num(value) + (f" [{_num(lo)}, {_num(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else "")


def cost_text(frame: pd.DataFrame, kind: str, setting: str = "") -> str:
    header = ["Method", "Tokens/verify", "τ", "Draft ms/step", "Verify ms/step", "Other ms/step", "ms/token",
              "Draft params", "≠ AR"]

    def render(rec: dict) -> list[str]:
        mism = rec.get("mismatches", math.nan)
        return [frame_label(rec), _num(rec["tokens_per_verify"], 1), _num(rec["tau"]), _num(rec["draft_ms_per_step"]),
                _num(rec["verify_ms_per_step"]), _num(rec["other_ms_per_step"]),
                _interval_text(rec["ms_per_token"], rec["ms_per_token_lo"], rec["ms_per_token_hi"]),
                _params(int(rec["draft_parameters"])),
                "–" if mism is None or not np.isfinite(mism) else f"{int(mism)}/{int(rec['answers'])}"]

    caption = ("Per verify step, pooled over benchmarks; other = wall - prefill - draft - verify (sampling, cache "
               "updates, bookkeeping). ms/token: (draft + verify + other) per step / τ = Σ ms / Σ tokens, with its "
               f"{int(CI_LEVEL * 100)}% bootstrap interval over answers; AR's row is plain decoding. " + TOKENS_NOTE
               + "≠ AR: greedy answers that differ from AR's." + (f" Measured on {setting}." if setting else ""))
    return _grouped(frame, render, header, "lrrrrrrrr", kind, caption)


def depth_text(frame: pd.DataFrame, kind: str, setting: str = "") -> str:
    depths = [c for c in frame.columns if c.startswith("d") and c[1:].isdigit()]
    header = ["Method", "Steps", "Tokens/verify", *[f"d={c[1:]}" for c in depths]]

    def render(rec: dict) -> list[str]:
        return [frame_label(rec), str(int(rec["steps"])), _num(rec["tokens_per_verify"], 1),
                *[_num(rec[c]) for c in depths]]

    caption = ("d=k: share of verify steps whose accepted path reached depth k (pooled over benchmarks). "
               + TOKENS_NOTE + (f"Measured on {setting}." if setting else ""))
    return _grouped(frame, render, header, "lrr" + "r" * len(depths), kind, caption.strip())


def turn_text(frame: pd.DataFrame, kind: str, setting: str = "") -> str:
    turns = sorted(int(c[4:-4]) for c in frame.columns if c.startswith("turn") and c.endswith("_tau"))
    header = ["Method", *[h for t in turns for h in (f"Turn {t} τ", f"Turn {t} speedup")], "Tokens/verify"]

    def render(rec: dict) -> list[str]:
        return [frame_label(rec), *[x for t in turns for x in (_num(rec[f"turn{t}_tau"]),
                                                               _num(rec[f"turn{t}_speedup"], suffix="×"))],
                _num(rec["tokens_per_verify"], 1)]

    caption = ("Pooled over the multi-turn benchmarks; a later turn's prompt holds the earlier answers, which lookup "
               "drafters can copy. " + TOKENS_NOTE + (f"Measured on {setting}." if setting else ""))
    return _grouped(frame, render, header, "l" + "r" * (2 * len(turns) + 1), kind, caption.strip())


# ----------------------------------------------------------------------------- files

def _write(path: Path, text: str) -> Path:
    return write_atomic(path, text)


def _csv(frame: pd.DataFrame, path: Path) -> Path:
    return write_atomic(path, frame.to_csv(index=False, lineterminator="\n"))


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
        _write(out / f"{main}.md", main_text(run, stats.cells, "md", ci, title)),
        _write(out / f"{main}.tex", main_text(run, stats.cells, "tex", ci, title)),
        _csv(stats.main, out / f"{main}.csv"),
    ]
    if stats.categories is not None:
        cat = stats.categories
        paths += [_write(out / "categories.md", main_text(run, cat.cells, "md", ci, title, cat.columns, cat.titles)),
                  _write(out / "categories.tex", main_text(run, cat.cells, "tex", ci, title, cat.columns, cat.titles)),
                  _csv(category_frame(cat), out / "categories.csv")]
    frames = [("cost", stats.cost, cost_text), ("depth", stats.depth, depth_text)]
    if not stats.turns.empty:
        frames.append(("turns", stats.turns, turn_text))
    setting = setting_text(run)
    for name, frame, text in frames:
        paths += [_write(out / f"{name}.md", text(frame, "md", setting)),
                  _write(out / f"{name}.tex", text(frame, "tex", setting)), _csv(frame, out / f"{name}.csv")]
    return paths + write_peer_tables(run, setting)
