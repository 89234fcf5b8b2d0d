"""Paper-style tables and plots, rebuilt from a run folder's `records.jsonl` and `meta.json` alone.

Rows are (temperature, method or ablation variant, acceptance rule); AR is the reference every
speedup is measured against and appears only in the cost table. Layout as in the EAGLE / Gumiho
papers: one block per temperature, a Speedup and a τ column per benchmark, and a Mean column
(the mean of the benchmark columns, as the papers compute it).

Statistics (the formulas of harness/metrics.py, so the numbers equal summary.csv's):
- τ = Σ tokens / Σ verify steps over a row's answers;
- speedup = (Σ tokens / Σ s of the method) / (Σ tokens / Σ s of AR) over the prompts that have
  both answers;
- 95% intervals: percentile bootstrap over answers (prompts, for speedup: each resample keeps
  a method answer with AR's answer to the same prompt), `N_BOOTSTRAP` resamples seeded from the
  cell's identity, so a rebuild gives identical files; the Mean's interval resamples every
  benchmark independently and averages.
Rows whose acceptance rule is lossy (typical) carry "(typical, lossy)" in every table and plot,
and never take the bold "best" mark.

Files: `tables/{main,cost,depth}.{md,tex,csv}` (+ `ablation.*` for `cli.py ablate` folders),
`plots/{speedup,tau,depth,time}.{png,svg}` (+ `ablation.*`).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.errors import SpecbenchError
from harness.core.verify import LOSSY_RULES
from harness.runs.metrics import (
    AR_METHOD,
    _dedupe,
    _prompt_key,
    _tokens_and_steps,
    attach_divergences,
    own_divergences,
    per_depth_acceptance,
)
from harness.runs.results import RunDir

N_BOOTSTRAP = 2000
CI_LEVEL = 0.95
MEAN = "mean"

# One colour per method in every figure (Okabe-Ito, colour-blind safe); others get a stable pick.
METHOD_COLORS = {
    AR_METHOD: "#7F7F7F", "pld": "#E69F00", "medusa": "#56B4E9", "hydra": "#009E73",
    "eagle": "#0072B2", "eagle2": "#D55E00", "gumiho": "#CC79A7",
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


def benchmark_title(name: str) -> str:
    from harness.runs.benchmarks import BENCHMARKS

    if name == MEAN:
        return "Mean"
    return BENCHMARKS.get(name, {}).get("title", name)


def fmt_temperature(t: float) -> str:
    return f"{t:g}"


# ----------------------------------------------------------------------------- loading

@dataclass(frozen=True)
class Row:
    """One table row: a method (or ablation variant) at one temperature under one acceptance rule."""

    temperature: float
    method: str
    config_hash: str
    acceptance: str
    name: str  # method name, or the variant's label in an ablation

    @property
    def lossy(self) -> bool:
        return self.acceptance in LOSSY_RULES

    @property
    def label(self) -> str:
        return f"{self.name} ({self.acceptance}, lossy)" if self.lossy else self.name


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

    def multi_variant(self) -> bool:
        """True when one method appears in several configs (an ablation): colour by variant."""
        configs: dict[str, set[str]] = {}
        for r in self.rows:
            configs.setdefault(r.method, set()).add(r.config_hash)
        return any(len(c) > 1 for c in configs.values())

    def color(self, row: Row) -> str:
        if self.multi_variant() and row.method != AR_METHOD:
            names = list(dict.fromkeys(r.name for r in self.rows))
            return VARIANT_COLORS[names.index(row.name) % len(VARIANT_COLORS)]
        return method_color(row.method)


def _row_of(rec: dict, names: dict[str, str]) -> Row:
    chash = rec.get("config_hash") or ""
    return Row(float(rec["temperature"]), rec["method"], chash, rec["acceptance"],
               names.get(chash, rec["method"]))


def load_run(path: Path) -> RunData:
    """Records (deduplicated by key) and meta of a run folder, with its rows in table order."""
    rd = RunDir(Path(path))
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    meta = rd.read_meta() or {}
    records = attach_divergences(_dedupe(rd.records()))
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

    def order(row: Row) -> tuple:
        return (row.temperature, label_order.get(row.name, len(label_order) + first_seen[row.name]),
                accept_seen[row.acceptance])

    rows = sorted((r for r in by_row if r.method != AR_METHOD), key=order)
    ar_rows = sorted((r for r in by_row if r.method == AR_METHOD), key=order)
    present = list(dict.fromkeys(r["benchmark"] for r in records))
    wanted = [b for b in config.get("benchmarks", []) if b in present]
    benchmarks = wanted + [b for b in present if b not in wanted]
    return RunData(Path(path), records, meta, benchmarks, rows, ar_rows, parameters,
                   config.get("ablation"), by_row)


# ----------------------------------------------------------------------------- statistics

def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def _weights(n: int, seed: int, resamples: int = N_BOOTSTRAP) -> np.ndarray:
    """[resamples, n] counts of each answer in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


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
    tau_reps: np.ndarray | None
    speedup_reps: np.ndarray | None

    @property
    def tau_ci(self) -> tuple[float, float]:
        return _interval(self.tau_reps)

    @property
    def speedup_ci(self) -> tuple[float, float]:
        return _interval(self.speedup_reps)


def cell_stats(recs: list[dict], ar_by_prompt: dict[tuple, list[dict]], seed_parts: Sequence[Any]) -> Cell:
    """τ and speedup of one (row, benchmark) with their bootstrap replicates."""
    if not recs:
        return Cell(0, math.nan, math.nan, None, None)
    ts = np.array([_tokens_and_steps(r) for r in recs], dtype=float)
    tau = float(_ratio(ts[:, 0].sum(), ts[:, 1].sum()))
    sums = _weights(len(recs), _seed("tau", *seed_parts)) @ ts
    tau_reps = _ratio(sums[:, 0], sums[:, 1])
    pairs = []
    for r in recs:
        ar = ar_by_prompt.get(_prompt_key(r))
        if ar:
            pairs.append((r["new_tokens"], r["wall_s"], sum(a["new_tokens"] for a in ar),
                          sum(a["wall_s"] for a in ar)))
    speedup, speedup_reps = math.nan, None
    if pairs:
        p = np.array(pairs, dtype=float)
        speedup = float(_ratio(p[:, 0].sum() * p[:, 3].sum(), p[:, 1].sum() * p[:, 2].sum()))
        w = _weights(len(pairs), _seed("speedup", *seed_parts))
        s = w @ p
        speedup_reps = _ratio(s[:, 0] * s[:, 3], s[:, 1] * s[:, 2])
    return Cell(len(recs), tau, speedup, tau_reps, speedup_reps)


def _mean_cell(cells: list[Cell]) -> Cell:
    """Mean over benchmarks (NaN unless every benchmark has a value) with its bootstrap interval."""
    if not cells:
        return Cell(0, math.nan, math.nan, None, None)

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if all(np.isfinite(values)) else math.nan

    def mean_reps(reps: list[np.ndarray | None]) -> np.ndarray | None:
        return None if any(r is None for r in reps) else np.mean(np.stack(reps), axis=0)

    return Cell(sum(c.answers for c in cells), mean([c.tau for c in cells]), mean([c.speedup for c in cells]),
                mean_reps([c.tau_reps for c in cells]), mean_reps([c.speedup_reps for c in cells]))


def main_cells(run: RunData) -> dict[Row, dict[str, Cell]]:
    """{row: {benchmark | "mean": Cell}} for every non-AR row."""
    ar_by_prompt = _ar_by_prompt(run)
    out: dict[Row, dict[str, Cell]] = {}
    for row in run.rows:
        cells = {}
        for b in run.benchmarks:
            cells[b] = cell_stats(run.row_records(row, b), ar_by_prompt,
                                  (row.temperature, row.method, row.config_hash, row.acceptance, b))
        cells[MEAN] = _mean_cell([cells[b] for b in run.benchmarks])
        out[row] = cells
    return out


def main_frame(run: RunData, cells: dict[Row, dict[str, Cell]] | None = None) -> pd.DataFrame:
    """Long form: one line per (row, benchmark or mean) with the estimates and 95% intervals."""
    cells = cells if cells is not None else main_cells(run)
    lines = []
    for row, by_bench in cells.items():
        for b, c in by_bench.items():
            (tl, th), (sl, sh) = c.tau_ci, c.speedup_ci
            lines.append({
                "temperature": row.temperature, "method": row.method, "variant": row.name,
                "acceptance": row.acceptance, "lossy": row.lossy, "config_hash": row.config_hash,
                "benchmark": b, "answers": c.answers, "speedup": c.speedup, "speedup_lo": sl,
                "speedup_hi": sh, "tau": c.tau, "tau_lo": tl, "tau_hi": th,
            })
    return pd.DataFrame(lines).round({k: 4 for k in ("speedup", "speedup_lo", "speedup_hi", "tau", "tau_lo", "tau_hi")})


def _row_fields(row: Row) -> dict[str, Any]:
    """The columns that identify a row in every per-row frame."""
    return {"temperature": row.temperature, "method": row.method, "variant": row.name,
            "acceptance": row.acceptance, "lossy": row.lossy, "config_hash": row.config_hash}


def _ar_by_prompt(run: RunData) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for rec in run.records:
        if rec["method"] == AR_METHOD:
            out.setdefault(_prompt_key(rec), []).append(rec)
    return out


def turn_frame(run: RunData) -> pd.DataFrame:
    """Per (temperature, row), pooled over the benchmarks with more than one turn (MT-Bench): τ and
    speedup of each turn. A later turn sees the earlier answers, which a lookup drafter can copy
    from, so the turns can rank methods differently. Empty when no benchmark has two turns."""
    turns_of: dict[str, set[int]] = {}
    for rec in run.records:
        turns_of.setdefault(rec["benchmark"], set()).add(int(rec["turn"]))
    multi = {b for b, t in turns_of.items() if len(t) > 1}
    if not multi:
        return pd.DataFrame()
    turns = sorted(set().union(*(turns_of[b] for b in multi)))
    ar_by_prompt = _ar_by_prompt(run)
    lines = []
    for row in run.rows:
        recs = [r for r in run.row_records(row) if r["benchmark"] in multi]
        line = _row_fields(row)
        for t in turns:
            cell = cell_stats([r for r in recs if int(r["turn"]) == t], ar_by_prompt,
                              (row.temperature, row.method, row.config_hash, row.acceptance, "turn", t))
            line.update({f"turn{t + 1}_answers": cell.answers, f"turn{t + 1}_tau": round(cell.tau, 4),
                         f"turn{t + 1}_speedup": round(cell.speedup, 4)})
        lines.append(line)
    return pd.DataFrame(lines)


def cost_frame(run: RunData) -> pd.DataFrame:
    """Per (temperature, row), pooled over benchmarks: ms per verify step drafting, verifying and
    the rest (wall - prefill - draft - verify), mean tree size, τ and drafter parameters. AR first."""
    lines = []
    for row in sorted(run.ar_rows + run.rows, key=lambda r: (r.temperature, r.method != AR_METHOD)):
        recs = run.row_records(row)
        steps = sum(_tokens_and_steps(r)[1] for r in recs)
        tokens = sum(_tokens_and_steps(r)[0] for r in recs)

        def total(column: str) -> float:
            return float(sum(sum((r.get("steps") or {}).get(column, [])) for r in recs))

        draft, verify, tree = total("draft_ms"), total("verify_ms"), total("tree_size")
        wall_ms = 1000.0 * sum(r["wall_s"] for r in recs)
        prefill_ms = 1000.0 * sum(r.get("prefill_s", 0.0) for r in recs)
        per = (lambda x: x / steps) if steps else (lambda x: math.nan)
        lines.append({
            **_row_fields(row), "answers": len(recs), "steps": steps, "draft_ms_per_step": per(draft),
            "verify_ms_per_step": per(verify), "other_ms_per_step": per(wall_ms - prefill_ms - draft - verify),
            "tree_size": per(tree), "tau": tokens / steps if steps else math.nan,
            "prefill_ms_per_answer": prefill_ms / len(recs) if recs else math.nan,
            "draft_parameters": run.parameters.get(row.config_hash, 0),
            # Greedy answers that left AR's output themselves; at T > 0 outputs are samples.
            "mismatches": (len(own_divergences(recs)) if row.temperature == 0 and row.method != AR_METHOD
                           else math.nan),
        })
    return pd.DataFrame(lines).round({"draft_ms_per_step": 3, "verify_ms_per_step": 3, "other_ms_per_step": 3,
                                      "tree_size": 3, "tau": 4, "prefill_ms_per_answer": 2})


def depth_frame(run: RunData) -> pd.DataFrame:
    """Per (temperature, row), pooled over benchmarks: for depth d, the share of verify steps whose
    accepted path reached d (columns d1, d2, ...; empty beyond the row's deepest acceptance)."""
    curves = {row: per_depth_acceptance(run.row_records(row)) for row in run.rows}
    depth = max((len(c) for c in curves.values()), default=0)
    lines = []
    for row, curve in curves.items():
        line = {**_row_fields(row), "steps": sum(len((r.get("steps") or {}).get("accepted", [])) for r in run.row_records(row))}
        for d in range(1, depth + 1):
            line[f"d{d}"] = round(curve[d - 1], 4) if d <= len(curve) else math.nan
        lines.append(line)
    return pd.DataFrame(lines)


# ----------------------------------------------------------------------------- rendering

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


def _best(values: dict[Row, float], rows: list[Row]) -> set[Row]:
    """Rows holding the best (largest) value, among lossless rows; none when fewer than two compete."""
    finite = {r: v for r, v in values.items() if r in rows and not r.lossy and np.isfinite(v)}
    if len(finite) < 2:
        return set()
    top = max(finite.values())
    return {r for r, v in finite.items() if round(v, 2) == round(top, 2)}


def _main_lines(run: RunData, cells: dict[Row, dict[str, Cell]], rows: list[Row], ci: bool,
                bold: tuple[str, str]) -> list[list[str]]:
    columns = run.columns
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


NOTE = ("Speedup: tokens/s over plain decoding (AR) on the same prompts in the same run; "
        "τ: new tokens per verify step. ")


def main_markdown(run: RunData, cells: dict[Row, dict[str, Cell]], ci: bool = False,
                  row_title: str = "Method") -> str:
    header = [row_title]
    for b in run.columns:
        header += [f"{benchmark_title(b)} Speedup", f"{benchmark_title(b)} τ"]
    out = []
    for t in run.temperatures:
        rows = [r for r in run.rows if r.temperature == t]
        if not rows:
            continue
        out += [f"**{_block_title(t, rows)}**", ""]
        out += _md_table(header, _main_lines(run, cells, rows, ci, ("**", "**")), "l" + "r" * (len(header) - 1))
        out.append("")
    answers = sorted({c.answers for by in cells.values() for b, c in by.items() if b != MEAN})
    note = NOTE + f"Answers per cell: {', '.join(map(str, answers))}."
    if ci:
        note += f" Brackets: {int(CI_LEVEL * 100)}% bootstrap interval over answers."
    out.append(note)
    return "\n".join(out) + "\n"


def main_latex(run: RunData, cells: dict[Row, dict[str, Cell]], row_title: str = "Method") -> str:
    columns = run.columns
    ncol = 1 + 2 * len(columns)
    out = ["% specbench table (rebuild: python cli.py table RUN_DIR); needs \\usepackage{booktabs}",
           "\\begin{tabular}{l" + "rr" * len(columns) + "}", "\\toprule",
           " & " + " & ".join(f"\\multicolumn{{2}}{{c}}{{{_tex_escape(benchmark_title(b))}}}" for b in columns)
           + " \\\\",
           " ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(columns))),
           _tex_escape(row_title) + " & " + " & ".join(["Speedup & $\\tau$"] * len(columns)) + " \\\\"]
    for t in run.temperatures:
        rows = [r for r in run.rows if r.temperature == t]
        if not rows:
            continue
        out += ["\\midrule", f"\\multicolumn{{{ncol}}}{{l}}{{\\textit{{{_tex_escape(_block_title(t, rows))}}}}} \\\\"]
        for line in _main_lines(run, cells, rows, False, ("\x00", "\x01")):
            cells_tex = [_tex_escape(x).replace("\x00", "\\textbf{").replace("\x01", "}") for x in line]
            out.append(" & ".join(cells_tex) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out) + "\n"


def _grouped(frame: pd.DataFrame, render, header: list[str], align: str, kind: str) -> str:
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


def _label(rec: dict) -> str:
    name = rec["variant"]
    return f"{name} ({rec['acceptance']}, lossy)" if rec["lossy"] else name


def cost_text(frame: pd.DataFrame, kind: str) -> str:
    header = ["Method", "Draft ms/step", "Verify ms/step", "Other ms/step", "Tree size", "τ", "Draft params",
              "≠ AR"]

    def render(rec: dict) -> list[str]:
        mism = rec.get("mismatches", math.nan)
        return [_label(rec), _num(rec["draft_ms_per_step"]), _num(rec["verify_ms_per_step"]),
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
        return [_label(rec), str(int(rec["steps"])), *[_num(rec[c]) for c in depths]]

    text = _grouped(frame, render, header, "lr" + "r" * len(depths), kind)
    if kind == "md":
        text += "Share of verify steps whose accepted path reached depth d (pooled over benchmarks).\n"
    return text


def turn_text(frame: pd.DataFrame, kind: str) -> str:
    turns = sorted(int(c[4:-4]) for c in frame.columns if c.startswith("turn") and c.endswith("_tau"))
    header = ["Method", *[h for t in turns for h in (f"Turn {t} τ", f"Turn {t} speedup")]]

    def render(rec: dict) -> list[str]:
        return [_label(rec), *[x for t in turns for x in (_num(rec[f"turn{t}_tau"]),
                                                          _num(rec[f"turn{t}_speedup"], suffix="×"))]]

    text = _grouped(frame, render, header, "l" + "r" * (2 * len(turns)), kind)
    if kind == "md":
        text += ("Pooled over the multi-turn benchmarks; a later turn's prompt holds the earlier answers, "
                 "which lookup drafters can copy.\n")
    return text


# ----------------------------------------------------------------------------- table files

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _csv(frame: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, lineterminator="\n")
    return path


def write_tables(run_dir: Path, ci: bool = False) -> list[Path]:
    """Write tables/main|cost|depth(.md/.tex/.csv), turns.* where a benchmark has several turns,
    and ablation.* for an ablation folder."""
    run = load_run(run_dir)
    if not run.rows:
        raise SpecbenchError(f"{run_dir} holds AR records only: nothing to compare")
    out = Path(run_dir) / "tables"
    cells = main_cells(run)
    main = "ablation" if run.ablation else "main"
    title = "Variant" if run.ablation else "Method"
    paths = [
        _write(out / f"{main}.md", main_markdown(run, cells, ci, title)),
        _write(out / f"{main}.tex", main_latex(run, cells, title)),
        _csv(main_frame(run, cells), out / f"{main}.csv"),
    ]
    frames = [("cost", cost_frame(run), cost_text), ("depth", depth_frame(run), depth_text)]
    turns = turn_frame(run)
    if not turns.empty:
        frames.append(("turns", turns, turn_text))
    for name, frame, text in frames:
        paths += [_write(out / f"{name}.md", text(frame, "md")), _write(out / f"{name}.tex", text(frame, "tex")),
                  _csv(frame, out / f"{name}.csv")]
    return paths


# ----------------------------------------------------------------------------- plots

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


def _bars(run: RunData, cells: dict[Row, dict[str, Cell]], metric: str, ylabel: str):
    temps = [t for t in run.temperatures if any(r.temperature == t for r in run.rows)]
    fig = _figure(0.55 + 1.55 * len(temps))
    axes = fig.subplots(len(temps), 1, squeeze=False)[:, 0]
    columns = run.columns
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
                          color=run.color(row), hatch="////" if row.lossy else "", edgecolor="white",
                          linewidth=0.3, yerr=err, error_kw={"elinewidth": 0.6, "capsize": 1.2, "ecolor": "#333333"})
            handles.setdefault(row.label, bars)
        ax.axhline(1.0, color=METHOD_COLORS[AR_METHOD], linestyle="--", linewidth=0.8, zorder=0)
        ax.set_xticks(x, [benchmark_title(b) for b in columns],
                      rotation=30 if len(columns) > 4 else 0, ha="right" if len(columns) > 4 else "center",
                      rotation_mode="anchor")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(axis="x", visible=False)
        if len(temps) > 1 or any(t > 0 for t in temps):
            ax.set_title(f"T = {fmt_temperature(t)}", loc="left")
    _legend_above(fig, list(handles.values()), list(handles))
    return fig


def _depth_plot(run: RunData):
    fig = _figure(2.2)
    ax = fig.subplots()
    temps = run.temperatures
    handles, labels = [], []
    for row in run.rows:
        curve = per_depth_acceptance(run.row_records(row))
        if not curve:
            continue
        style = LINESTYLES[temps.index(row.temperature) % len(LINESTYLES)]
        (line,) = ax.plot(range(1, len(curve) + 1), curve, linestyle=style, marker="o", color=run.color(row),
                          markerfacecolor="white" if row.lossy else run.color(row))
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
    names = [_label(r) + (f"  T={fmt_temperature(r['temperature'])}" if len(temps) > 1 else "") for r in rows]
    ax.set_yticks(y, names)
    for tick, r in zip(ax.get_yticklabels(), rows):
        row = Row(r["temperature"], r["method"], r["config_hash"], r["acceptance"], r["variant"])
        tick.set_color(run.color(row))
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


def write_plots(run_dir: Path) -> list[Path]:
    """Write plots/{speedup,tau,depth,time}.{png,svg} (+ ablation.*) for a run folder."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import rc_context

    run = load_run(run_dir)
    if not run.rows:
        raise SpecbenchError(f"{run_dir} holds AR records only: nothing to plot")
    out = Path(run_dir) / "plots"
    cells = main_cells(run)
    paths: list[Path] = []
    with rc_context(_style()):
        figures = [("speedup", _bars(run, cells, "speedup", "Speedup over AR (×)")),
                   ("tau", _bars(run, cells, "tau", "τ (tokens per verify step)")),
                   ("depth", _depth_plot(run)), ("time", _time_plot(run, cost_frame(run)))]
        if run.ablation:
            figures.append(("ablation", _ablation_plot(run, cells)))
        for name, fig in figures:
            if fig is not None:
                paths += _save(fig, out, name)
    return paths


def write_report(run_dir: Path, ci: bool = False) -> list[Path]:
    return write_tables(run_dir, ci) + write_plots(run_dir)
