"""Tables, plots, bootstrap intervals and rebuild equality on synthetic run folders (no model)."""
from __future__ import annotations

import io
import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from harness.core.errors import SpecbenchError
from harness.core.hashing import config_hash
from harness.report import plots, statistics, tables
from harness.report.run_readme import write_report
from harness.report.statistics import compute_stats
from harness.runs import metrics
from harness.runs.metrics import summarize
from harness.runs.record import Record
from harness.runs.results import RunDir, record_key
from harness.runs.run_data import MEAN, Row, load_run

ACCEPT = {"pld": 0.35, "eagle": 0.7, "medusa": 0.55}
PARAMS = {"pld": 0, "eagle": 1_234_567, "medusa": 456_000}


def synth_records(methods=("pld", "eagle"), benchmarks=("mt_bench", "gsm8k"), temperatures=(0.0,),
                  questions=4, typical=False, seed=0, variants=None):
    """AR and methods on the same prompts; acceptance drawn per step from a per-method rate.

    `variants` ({label: (method, config)}) replaces `methods` for ablation-like folders.
    """
    rng = random.Random(seed)
    slots = [("ar", "ar", {})]
    if variants:
        slots += [(label, m, cfg) for label, (m, cfg) in variants.items()]
    else:
        slots += [(m, m, {"name": m}) for m in methods]
    out = []
    for t in temperatures:
        rules = ["greedy"] if t == 0 else ["lossless"] + (["typical"] if typical else [])
        for b in benchmarks:
            for q in range(questions):
                for label, method, cfg in slots:
                    for rule in (["none"] if method == "ar" else rules):
                        rate = ACCEPT.get(method, 0.5) + (0.1 if rule == "typical" else 0.0)
                        rate += 0.02 * cfg.get("max_draft", 0)
                        n_new, tokens, accepted, tree, draft, verify = 40, [], [], [], [], []
                        while sum(tokens) < n_new - 1:
                            size = 0 if method == "ar" else 6
                            a = 0
                            while a < size and rng.random() < rate:
                                a += 1
                            a = min(a, n_new - 1 - sum(tokens) - 1)
                            tokens.append(a + 1)
                            accepted.append(a)
                            tree.append(size)
                            draft.append(0.0 if method == "ar" else round(1 + rng.random(), 3))
                            verify.append(round(20 + size + rng.random() * 4, 3))
                        wall = 0.05 + (sum(draft) + sum(verify)) / 1000 + 0.001 * len(tokens)
                        chash = config_hash({"method": method, "config": cfg})
                        rec = {
                            "method": method, "method_config": cfg, "config_hash": chash,
                            "checkpoint_hash": None if method in ("ar", "pld") else f"ck-{method}",
                            "target": "tiny", "dtype": "float32", "device": "cpu", "benchmark": b,
                            "question_id": 100 + q, "category": "c", "turn": 0, "temperature": t, "top_p": 1.0,
                            "acceptance": rule, "seed": 7 + q, "prompt_tokens": 30 + q, "new_tokens": n_new,
                            "output_ids": list(range(n_new)), "stop_reason": "length", "wall_s": round(wall, 6),
                            "prefill_s": 0.05, "first_token_from_prefill": True,
                            "steps": {"tree_size": tree, "accepted": accepted, "tokens": tokens,
                                      "draft_ms": draft, "verify_ms": verify},
                        }
                        rec["key"] = record_key(rec)
                        out.append((label, rec))
    return out


CPU_KIND = "Test CPU 9000 (AMX-BF16)"


def write_run(path: Path, methods=("pld", "eagle"), benchmarks=("mt_bench", "gsm8k"), temperatures=(0.0,),
              questions=4, typical=False, seed=0, variants=None, ablation=None, max_new_tokens=40,
              cpu_flags=None, cpu_kind=CPU_KIND) -> Path:
    labelled = synth_records(methods, benchmarks, temperatures, questions, typical, seed, variants)
    resolved = {}
    for label, rec in labelled:
        resolved.setdefault(label, {"config": rec["method_config"], "config_hash": rec["config_hash"],
                                    "checkpoint_hash": rec["checkpoint_hash"],
                                    "parameters": PARAMS.get(rec["method"], 0)})
    config = {"command": "compare", "methods": list(methods), "benchmarks": list(benchmarks),
              "temperatures": list(temperatures), "target": "tiny", "dtype": "float32", "device": "cpu",
              "limit": questions, "max_new_tokens": max_new_tokens, "top_p": 1.0, "seed": 0,
              "methods_resolved": resolved}
    if ablation:
        config["ablation"] = ablation
    path.mkdir(parents=True, exist_ok=True)
    meta = {"config": config, "config_hash": config_hash(config), "commit": "abc123", "dirty": False,
            "date": "2026-01-01T00:00:00+00:00",
            "cpu_flags": cpu_flags or {"avx2": True, "avx512f": True, "avx512_bf16": False, "amx_bf16": False,
                                       "amx_tile": False},
            "gpu": None, "official_prompts": {b: True for b in benchmarks}, "cpu_kind": cpu_kind,
            "cpu_model": "Test CPU 9000", "torch_threads": 2}
    (path / "meta.json").write_text(json.dumps(meta, indent=2))
    rd = RunDir(path)
    for _, rec in labelled:
        rd.append(rec)
    return path


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", methods=("pld", "eagle", "medusa"), temperatures=(0.0, 1.0), typical=True)


# ----------------------------------------------------------------------------- numbers

def test_summary_csv_and_tables_come_from_one_computation(run_dir, monkeypatch):
    """summary.csv, the tables and the τ baselines take τ and speedup from the named metrics
    (metrics.TAU, metrics.SPEEDUP): equal to the bit, and a change there reaches all three."""
    stats = compute_stats(load_run(run_dir))
    summary = summarize(RunDir(run_dir).read_records())
    for row, by_bench in stats.cells.items():
        for b in stats.run.benchmarks:
            s = summary[(summary.method == row.method) & (summary.benchmark == b)
                        & (summary.temperature == row.temperature) & (summary.acceptance == row.acceptance)]
            assert len(s) == 1
            assert by_bench[b].tau == float(s.tau.iloc[0]) and by_bench[b].speedup == float(s.speedup.iloc[0])
        mean = by_bench[MEAN]
        assert mean.tau == pytest.approx(np.mean([by_bench[b].tau for b in stats.run.benchmarks]))
    monkeypatch.setattr(metrics.RatioOfSums, "estimate", lambda self, rows, weights=None: np.asarray(7.0))
    assert set(summarize(RunDir(run_dir).read_records()).tau) == {7.0}
    cells = compute_stats(load_run(run_dir), resamples=0).cells
    assert {c.tau for by_bench in cells.values() for c in by_bench.values()} == {7.0}
    from harness.runs.regress import run_cells

    assert {(c["tau"], c["speedup"]) for c in run_cells(load_run(run_dir))} == {(7.0, 7.0)}


def test_a_rebuild_computes_the_statistics_once(run_dir, monkeypatch):
    """Tables, plots and the folder's README render one computation: a rebuild draws exactly the
    bootstrap replicates that one `compute_stats` draws."""
    calls = []
    real = metrics.RatioOfSums.replicates
    monkeypatch.setattr(metrics.RatioOfSums, "replicates", lambda *a, **k: calls.append(1) or real(*a, **k))
    compute_stats(load_run(run_dir))
    once = len(calls)
    assert once > 0
    calls.clear()
    paths = write_report(run_dir, ci=True)
    assert len(calls) == once
    assert {p.parent.name for p in paths if p.name != "README.md"} == {"tables", "plots"}


def test_bootstrap_interval_is_deterministic_and_covers_the_estimate(run_dir):
    a = compute_stats(load_run(run_dir)).main
    b = compute_stats(load_run(run_dir)).main
    assert a.equals(b)
    assert (a.tau_lo <= a.tau + 1e-9).all() and (a.tau <= a.tau_hi + 1e-9).all()
    assert (a.speedup_lo <= a.speedup + 1e-9).all() and (a.speedup <= a.speedup_hi + 1e-9).all()
    assert (a.tau_hi > a.tau_lo).all()


def test_bootstrap_on_identical_answers_collapses():
    rec = {"method": "pld", "benchmark": "b", "question_id": 1, "turn": 0, "temperature": 0.0, "top_p": 1.0,
           "acceptance": "greedy", "seed": 0, "new_tokens": 10, "wall_s": 1.0, "steps": {"tokens": [2, 2, 2], "accepted": [1, 1, 1]}}
    ar = {**rec, "method": "ar", "acceptance": "none", "wall_s": 2.0, "steps": {"tokens": [1] * 9}}
    recs = [Record.from_dict(dict(rec, question_id=i)) for i in range(5)]
    ars = metrics.ar_by_prompt(Record.from_dict(dict(ar, question_id=i)) for i in range(5))
    cell = statistics.cell_stats(recs, ars, ("x",))
    assert cell.tau == 2.0 and cell.tau_ci == (2.0, 2.0)
    assert cell.speedup == 2.0 and cell.speedup_ci == pytest.approx((2.0, 2.0))


def test_bootstrap_interval_narrows_with_more_answers(tmp_path):
    small = compute_stats(load_run(write_run(tmp_path / "s", questions=4))).main
    large = compute_stats(load_run(write_run(tmp_path / "l", questions=40))).main
    w = lambda f: float((f.tau_hi - f.tau_lo).mean())  # noqa: E731
    assert w(large) < w(small)


def test_cost_and_depth_tables(run_dir):
    stats = compute_stats(load_run(run_dir))
    cost = stats.cost
    ar = cost[cost.method == "ar"].iloc[0]
    assert ar.tau == 1.0 and ar.tokens_per_verify == 0 and ar.draft_parameters == 0
    eagle = cost[(cost.method == "eagle") & (cost.temperature == 0)].iloc[0]
    assert eagle.draft_parameters == PARAMS["eagle"] and eagle.tokens_per_verify == 6
    # other = wall - prefill - draft - verify: the synthetic records add 1 ms per step.
    assert eagle.other_ms_per_step == pytest.approx(1.0, abs=1e-3)
    depth = stats.depth
    d = depth[(depth.method == "eagle") & (depth.temperature == 0)].iloc[0]
    assert 1 >= d.d1 >= d.d2 >= d.d3 > 0
    assert "ar" not in set(depth.method)


def test_lossy_comes_from_the_records(tmp_path):
    """A row is lossy when its records say so (`"lossy"`, written by the runner); records written
    before the field existed fall back to typical, the one lossy rule of that time."""
    path = write_run(tmp_path / "run", methods=("pld",), temperatures=(1.0,), typical=True)
    assert {r.acceptance: r.lossy for r in load_run(path).rows} == {"lossless": False, "typical": True}
    recs = [json.loads(line) for line in (path / "records.jsonl").read_text().splitlines()]
    for r in recs:  # a made-up rule set: what the records say wins over the rule's name
        r["lossy"] = r["acceptance"] == "lossless"
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    stats = compute_stats(load_run(path))
    assert {r.acceptance: r.lossy for r in stats.run.rows} == {"lossless": True, "typical": False}
    assert set(stats.main[stats.main.lossy].acceptance) == {"lossless"}
    tables.write_tables(stats)
    md = (path / "tables" / "main.md").read_text()
    assert "| Prompt lookup (lossless, lossy) |" in md and "| Prompt lookup |" in md


def test_turn_table_splits_multi_turn_benchmarks_by_turn(tmp_path):
    path = write_run(tmp_path / "run", methods=("pld", "eagle"), questions=4)
    recs = [json.loads(line) for line in (path / "records.jsonl").read_text().splitlines()]
    for r in recs:  # MT-Bench questions 102 and 103 become second turns
        if r["benchmark"] == "mt_bench" and r["question_id"] >= 102:
            r["turn"] = 1
            r["key"] = record_key(r)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    frame = statistics.turn_frame(statistics.turn_cells(load_run(path), resamples=0))
    for method in ("pld", "eagle"):
        line = frame[frame.method == method].iloc[0]
        for turn, qids in ((1, (100, 101)), (2, (102, 103))):
            mine = [r for r in recs if r["method"] == method and r["benchmark"] == "mt_bench" and r["question_id"] in qids]
            tau = sum(sum(r["steps"]["tokens"]) for r in mine) / sum(len(r["steps"]["tokens"]) for r in mine)
            assert line[f"turn{turn}_answers"] == 2 and line[f"turn{turn}_tau"] == pytest.approx(tau, abs=1e-4)
            assert line[f"turn{turn}_speedup"] > 0
    written = [p.name for p in write_report(path)]
    assert "turns.md" in written and "Turn 2 τ" in (path / "tables" / "turns.md").read_text()
    assert "turns.png" in written and "turns.svg" in written  # τ per turn, every method
    # no benchmark with two turns: no turn table
    single = write_run(tmp_path / "single", methods=("pld",), questions=2)
    assert statistics.turn_cells(load_run(single)) is None
    assert statistics.turn_frame(None).empty
    assert not {"turns.md", "turns.png"} & {p.name for p in write_report(single)}


# ----------------------------------------------------------------------------- files

def test_tables_layout(run_dir):
    tables.write_tables(compute_stats(load_run(run_dir)))
    md = (run_dir / "tables" / "main.md").read_text()
    assert "**Temperature 0 (greedy)**" in md and "**Temperature 1 (lossless, typical)**" in md
    assert ("| Method | MT-Bench Speedup | MT-Bench τ | GSM8K Speedup | GSM8K τ | Mean Speedup | Mean τ "
            "| Tokens/verify |") in md
    assert "EAGLE (typical, lossy)" in md and "[" not in md.split("\n\n")[1]  # no CI without --ci
    tex = (run_dir / "tables" / "main.tex").read_text()
    assert "\\toprule" in tex and "\\multicolumn{2}{c}{MT-Bench}" in tex and "\\textbf{" in tex
    # Lossy rows are labelled and never bold.
    lossy = [line for line in tex.splitlines() if "lossy" in line]
    assert lossy and not any("textbf" in line for line in lossy)
    for kind in ("cost", "depth"):
        text = (run_dir / "tables" / f"{kind}.md").read_text()
        assert "EAGLE (typical, lossy)" in text
    csv = (run_dir / "tables" / "main.csv").read_text().splitlines()
    assert csv[0] == ("temperature,method,variant,departures,acceptance,lossy,config_hash,benchmark,answers,speedup,"
                      "speedup_lo,speedup_hi,tau,tau_lo,tau_hi,tokens_per_verify")
    tables.write_tables(compute_stats(load_run(run_dir)), ci=True)
    assert "Brackets: 95% bootstrap interval" in (run_dir / "tables" / "main.md").read_text()


def _cell(value: float, lo: float, hi: float) -> statistics.Cell:
    """A cell whose τ and speedup are `value` with the 95% interval [lo, hi]."""
    reps = np.repeat([lo, value, hi], 200)  # the 2.5th percentile is lo, the 97.5th hi
    return statistics.Cell(10, value, value, reps, reps)


def _row(method: str, lossy: bool = False) -> Row:
    return Row(0.0, method, method, "typical" if lossy else "greedy", method, lossy)


def test_emphasis_bolds_a_clear_win_and_marks_a_tie():
    a, b, c, lossy = _row("eagle"), _row("pld"), _row("medusa"), _row("hydra", lossy=True)
    clear = {a: _cell(2.0, 1.9, 2.1), b: _cell(1.5, 1.4, 1.6), c: _cell(1.0, 0.9, 1.1), lossy: _cell(3.0, 2.9, 3.1)}
    assert tables.emphasis(clear, list(clear), "tau") == {a: "best"}  # the lossy row never competes
    # the runner-up's interval reaches into the best's: both tied, the third (clear of the best) not
    tie = {**clear, b: _cell(1.8, 1.6, 1.95)}
    assert tables.emphasis(tie, list(tie), "tau") == {a: "tie", b: "tie"}
    # a wide interval lower down overlaps the best's too
    wide = {**clear, c: _cell(1.2, 0.5, 1.92)}
    assert tables.emphasis(wide, list(wide), "speedup") == {a: "tie", c: "tie"}
    # without intervals nothing can be told apart; with one competitor nothing is marked
    bare = {a: statistics.Cell(10, 2.0, 2.0, None, None), b: statistics.Cell(10, 1.0, 1.0, None, None)}
    assert tables.emphasis(bare, list(bare), "tau") == {a: "tie", b: "tie"}
    assert tables.emphasis(clear, [a, lossy], "tau") == {}


def _main_line(md: str, label: str, block: int = 0) -> str:
    return [line for line in md.splitlines() if line.startswith(f"| {label} |")][block]


def test_best_is_bold_only_when_its_interval_clears_the_rest(tmp_path):
    run_dir = write_run(tmp_path / "r", methods=("pld", "eagle"))
    stats = compute_stats(load_run(run_dir))
    tables.write_tables(stats)
    md = (run_dir / "tables" / "main.md").read_text()
    eagle, pld = _main_line(md, "EAGLE"), _main_line(md, "Prompt lookup")
    by = {r.method: c for r, c in stats.cells.items()}
    for b in stats.run.columns:  # eagle accepts twice as often: its τ interval clears pld's everywhere
        assert by["eagle"][b].tau_ci[0] > by["pld"][b].tau_ci[1]
        assert f"**{by['eagle'][b].tau:.2f}**" in eagle
    assert "**" not in pld and "†" not in pld
    assert "Bold: the best lossless value, its 95% bootstrap interval clear of every other" in md
    assert "†: tied for best" in md


def test_a_tie_gets_no_bold_but_a_dagger(tmp_path):
    """EAGLE's answers made identical to pld's: equal τ, overlapping intervals, so neither is bold."""
    from tests.test_regress import edit_records

    run_dir = write_run(tmp_path / "r", methods=("pld", "eagle"))
    pld = {r.prompt: r for r in RunDir(run_dir).read_records() if r.method == "pld"}

    def copy_pld(line):  # a line of the file, edited as JSON
        if line["method"] == "eagle":
            same = pld[Record.from_dict(line).prompt]
            line.update(steps=same.steps.to_json_dict(), wall_s=same.wall_s)
    edit_records(run_dir, copy_pld)
    tables.write_tables(compute_stats(load_run(run_dir)))
    md = (run_dir / "tables" / "main.md").read_text()
    tex = (run_dir / "tables" / "main.tex").read_text()
    for label in ("EAGLE", "Prompt lookup"):
        line = _main_line(md, label)
        assert "**" not in line and line.count("†") == 6  # speedup and τ of two benchmarks and the Mean
    assert "\\textbf" not in tex and "$^\\dagger$" in tex


def test_every_table_defines_mean_and_shows_tokens_per_verify(run_dir):
    """The Mean is the arithmetic mean of the per-benchmark values, and the captions say so; every
    table has the rows' budget (draft tokens verified per step: 6 in the synthetic records)."""
    stats = compute_stats(load_run(run_dir))
    row = next(r for r in stats.run.rows if r.method == "eagle" and not r.lossy and r.temperature == 0)
    cells = stats.cells[row]
    assert cells["mean"].tau == pytest.approx((cells["mt_bench"].tau + cells["gsm8k"].tau) / 2, abs=1e-12)
    assert cells["mean"].tokens_per_verify == 6.0
    write_report(run_dir)
    md = (run_dir / "tables" / "main.md").read_text()
    assert "Mean: the arithmetic mean of the row's per-benchmark values" in md
    assert "\\textbf" in (run_dir / "tables" / "main.tex").read_text()
    assert _main_line(md, "EAGLE").endswith("| 6.0 |")
    written = sorted((run_dir / "tables").glob("*.md"))
    assert {p.stem for p in written} == {"main", "cost", "depth"}
    for path in written:
        text = path.read_text()
        assert "Tokens/verify" in text and CPU_KIND in text, path.name
    for name in ("main", "cost", "depth"):
        assert "tokens_per_verify" in (run_dir / "tables" / f"{name}.csv").read_text().splitlines()[0]


def test_rows_follow_the_declared_method_order_with_display_names(tmp_path):
    from methods.registry import method_info

    stats = compute_stats(load_run(write_run(tmp_path / "r", methods=("eagle", "medusa", "pld"))))
    assert [r.method for r in stats.run.rows] == ["pld", "medusa", "eagle"]
    assert [r.label for r in stats.run.rows] == [method_info(m).display_name for m in ("pld", "medusa", "eagle")]
    assert [r.label for r in stats.run.rows] == ["Prompt lookup", "Medusa", "EAGLE"]


def test_plots_written(run_dir):
    paths = plots.write_plots(compute_stats(load_run(run_dir)))
    names = sorted(p.name for p in paths)
    for stem in ("depth", "speedup", "tau", "time"):
        assert f"{stem}.png" in names and f"{stem}.svg" in names
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.fixture
def drawn(monkeypatch):
    """The figures write_plots draws, by name, instead of files."""
    figures = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, name: figures.setdefault(name, fig) and [])
    return figures


def test_every_figure_has_a_caption_naming_the_setting(run_dir, drawn):
    plots.write_plots(compute_stats(load_run(run_dir)))
    assert set(drawn) == {"speedup", "tau", "depth", "time"}
    for name, fig in drawn.items():
        text = " ".join(fig._supxlabel.get_text().split())
        assert text.startswith(f"tiny, float32, {CPU_KIND}, 2 threads · "), (name, text)
        per = "row" if name in ("depth", "time") else "cell"
        assert f"answers per {per}" in text and ("95% bootstrap intervals" in text or "no intervals" in text), text


def test_caption_derives_the_cpu_kind_of_older_folders(tmp_path, drawn):
    """Folders written before meta.json stored cpu_kind: derived from the CPU model and flags."""
    run_dir = write_run(tmp_path / "r", cpu_kind=None,
                        cpu_flags={"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": False})
    plots.write_plots(compute_stats(load_run(run_dir)))
    assert "Test CPU 9000 (AVX512-BF16, no AMX), 2 threads" in drawn["tau"]._supxlabel.get_text()


def test_method_colours_and_names_come_from_the_methods(run_dir, drawn):
    from matplotlib.colors import to_hex

    from methods.registry import get_method, method_info, method_names

    assert not hasattr(plots, "METHOD_COLORS")
    colours = [method_info(m).color for m in method_names()]
    assert len(set(colours)) == len(colours)  # one distinct colour per method
    assert plots.method_color("eagle") == get_method("eagle").color
    assert plots.method_color("newthing") == plots.method_color("newthing") == method_info("newthing").color
    plots.write_plots(compute_stats(load_run(run_dir)))
    legend = drawn["tau"].legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    # two columns, filled column by column: it reads row by row in the declared order
    assert labels == ["Prompt lookup", "EAGLE", "Medusa (typical, lossy)",
                      "Medusa", "Prompt lookup (typical, lossy)", "EAGLE (typical, lossy)"]
    patch = legend.get_patches()[labels.index("EAGLE")]
    assert to_hex(patch.get_facecolor()) == method_info("eagle").color.lower()


def test_depth_is_small_multiples_one_panel_per_method(run_dir, drawn):
    plots.write_plots(compute_stats(load_run(run_dir)))
    panels = [ax for ax in drawn["depth"].axes if ax.get_visible()]
    assert [ax.get_title(loc="left") for ax in panels] == ["Prompt lookup", "Medusa", "EAGLE"]
    # one line per setting: T=0 greedy, T=1 lossless, T=1 typical (lossy, hollow markers)
    assert [len(ax.get_lines()) for ax in panels] == [3, 3, 3]
    assert [line.get_markerfacecolor() for line in panels[2].get_lines()][2] == "white"
    legend = [t.get_text() for t in drawn["depth"].legends[0].get_texts()]
    assert legend == ["T=0 greedy", "T=1 lossless", "T=1 typical (lossy)"]


def test_time_is_ms_per_token_with_the_ar_line(run_dir, drawn):
    stats = compute_stats(load_run(run_dir))
    cost = stats.cost
    eagle = cost[(cost.method == "eagle") & (cost.temperature == 0)].iloc[0]
    per_step = eagle.draft_ms_per_step + eagle.verify_ms_per_step + eagle.other_ms_per_step
    assert eagle.ms_per_token == pytest.approx(per_step / eagle.tau, abs=2e-3)  # ms per step / τ
    assert eagle.ms_per_token_lo < eagle.ms_per_token < eagle.ms_per_token_hi
    plots.write_plots(stats)
    ar = cost[cost.method == "ar"].set_index("temperature")
    axes = {ax.get_label(): ax for ax in drawn["time"].axes}
    for t in (0.0, 1.0):  # per temperature: AR's ms per token as a line, AR's 'other' on the zoom
        dashed = [line.get_xdata()[0] for line in axes[f"time T={t:g}"].get_lines() if line.get_linestyle() == "--"]
        assert dashed == pytest.approx([ar.ms_per_token[t]])
        dashed = [line.get_xdata()[0] for line in axes[f"other T={t:g}"].get_lines() if line.get_linestyle() == "--"]
        assert dashed == pytest.approx([ar.other_ms_per_token[t]])
    # 'other' has an axis of its own: its scale is that of the part, not of the total
    zooms = [axes["other T=0"]]
    assert zooms and zooms[0].get_xlim()[1] < 0.5 * eagle.ms_per_token


def test_rebuild_by_cli_equals_compare_output(run_dir, tmp_path):
    """What `compare` writes after its grid (`write_report`) equals `table` + `plot`."""
    from cli import app

    write_report(run_dir, ci=True)
    first = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.parent.name in ("tables", "plots")}
    assert len(first) >= 9 + 8
    shutil.rmtree(run_dir / "tables")
    shutil.rmtree(run_dir / "plots")
    cli = CliRunner()
    assert cli.invoke(app, ["table", str(run_dir), "--ci"]).exit_code == 0
    assert cli.invoke(app, ["plot", str(run_dir)]).exit_code == 0
    again = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.parent.name in ("tables", "plots")}
    assert again.keys() == first.keys()
    for name in first:
        assert again[name] == first[name], name


def test_table_of_a_folder_without_records_is_one_line(tmp_path):
    from cli import app

    res = CliRunner().invoke(app, ["table", str(tmp_path)])
    assert res.exit_code == 2 and "no records.jsonl" in res.output
    with pytest.raises(SpecbenchError, match="AR records only"):
        write_report(write_run(tmp_path / "ar", methods=()), plots=False)
    with pytest.raises(SpecbenchError, match="AR records only"):
        write_report(tmp_path / "ar", tables=False)


def test_ablation_folder_tables_and_plot(tmp_path):
    variants = {"default": ("pld", {"max_draft": 10, "adaptive": True}),
                "max_draft=5": ("pld", {"max_draft": 5, "adaptive": True}),
                "max_draft=2": ("pld", {"max_draft": 2, "adaptive": True}),
                "adaptive=false": ("pld", {"max_draft": 10, "adaptive": False})}
    ablation = {"method": "pld", "sweep": {"max_draft": [5, 2], "adaptive": [False]}, "grid": False,
                "base_config": {"max_draft": 10, "adaptive": True},
                "variants": {k: {kk: vv for kk, vv in cfg.items() if vv != {"max_draft": 10, "adaptive": True}[kk]}
                             for k, (_, cfg) in variants.items()}}
    run_dir = write_run(tmp_path / "ab", variants=variants, ablation=ablation)
    paths = write_report(run_dir)
    names = {p.name for p in paths}
    assert {"ablation.md", "ablation.tex", "ablation.csv", "ablation.png", "ablation.svg"} <= names
    md = (run_dir / "tables" / "ablation.md").read_text()
    assert "| Variant |" in md
    rows = [line.split(" |")[0] for line in md.splitlines() if line.startswith("| ") and "Variant" not in line]
    assert rows == ["| default", "| max_draft=5", "| max_draft=2", "| adaptive=false"]
    frame = compute_stats(load_run(run_dir)).main
    tau = frame[frame.benchmark == "mean"].set_index("variant").tau
    assert tau["default"] > tau["max_draft=2"]  # the synthetic rate grows with max_draft


def test_rows_of_one_method_under_two_unlabelled_configs_stay_apart(tmp_path):
    run_dir = write_run(tmp_path / "r", variants={"a": ("pld", {"max_draft": 1}), "b": ("pld", {"max_draft": 9})})
    meta = json.loads((run_dir / "meta.json").read_text())
    del meta["config"]["methods_resolved"]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    stats = compute_stats(load_run(run_dir))
    assert len(stats.run.rows) == 2 and len({r.name for r in stats.run.rows}) == 2
    assert all(r.name.startswith("pld [") for r in stats.run.rows)
    assert not any(math.isnan(v) for v in stats.main.tau)


# ----------------------------------------------------------------------------- compare / ablate

def test_sweep_parsing_and_one_factor_at_a_time_variants():
    from harness.runs.compare import make_variants, parse_sweep, parse_values
    from methods.pld import PromptLookupDrafter as P

    assert parse_values("5,10") == [5, 10]
    assert parse_values("true,false") == [True, False]
    assert parse_values("off,paper,exact") == ["off", "paper", "exact"]
    assert parse_values("[1,2],[3,4]") == [[1, 2], [3, 4]]
    fixed, sweep = parse_sweep(["max_draft=2,5,10", "pld.adaptive=true,false", "max_ngram=2"], P)
    assert fixed == {"max_ngram": 2} and sweep == {"max_draft": [2, 5, 10], "adaptive": [True, False]}
    variants = make_variants(P, fixed, sweep)
    # the base (defaults + fixed), then each other value; values equal to the base are dropped
    assert variants == {"base": {"max_ngram": 2}, "max_draft=2": {"max_ngram": 2, "max_draft": 2},
                        "max_draft=5": {"max_ngram": 2, "max_draft": 5},
                        "adaptive=true": {"max_ngram": 2, "adaptive": True}}
    grid = make_variants(P, {}, {"max_draft": [2, 10], "adaptive": [True, False]}, grid=True)
    assert list(grid) == ["max_draft=2, adaptive=true", "max_draft=2, adaptive=false",
                          "max_draft=10, adaptive=true", "max_draft=10, adaptive=false"]


@pytest.mark.parametrize("pairs,needle", [
    (["max_drafts=1,2"], "did you mean 'max_draft'"),
    (["max_draft=3"], "nothing to sweep"),
    (["max_draft=1,2", "max_draft=3,4"], "given twice"),
    (["max_draft"], "key=v1,v2"),
])
def test_bad_sweeps_are_one_line(pairs, needle):
    from harness.runs.compare import parse_sweep
    from methods.pld import PromptLookupDrafter

    with pytest.raises(SpecbenchError, match=needle):
        parse_sweep(pairs, PromptLookupDrafter)


def test_sweep_of_defaults_only_is_refused():
    from harness.runs.compare import make_variants
    from methods.pld import PromptLookupDrafter

    with pytest.raises(SpecbenchError, match="equals the default"):
        make_variants(PromptLookupDrafter, {}, {"max_draft": [10], "adaptive": [False]})


class _Learned:
    """A stand-in for a learned drafter: weights exist for the default architecture only."""

    name = "fake"
    trainable = True
    defaults = {"layers": 1, "topk": 4}
    arch_keys = ("layers",)
    # what methods.registry.method_info reads (discovery orders methods by `order`)
    display_name, paper, year, color, order = "Fake", "", None, "", 100
    acceptance_rules, checkpoint_layout = ("greedy", "lossless"), ""

    @classmethod
    def resolve_config(cls, overrides):
        if set(overrides) - set(cls.defaults):
            raise SpecbenchError(f"method 'fake' has no config key(s) {sorted(set(overrides) - set(cls.defaults))}")
        return {**cls.defaults, **overrides}

    @classmethod
    def arch_hash(cls, config):
        return config_hash({k: config[k] for k in cls.arch_keys})

    @classmethod
    def create(cls, target, overrides, checkpoint=None):
        if cls.resolve_config(overrides)["layers"] != 1:
            raise SpecbenchError("no trained weights for 'fake'")
        return object()


def test_arch_variant_without_weights_names_train():
    from harness.runs.compare import check_arch_variants, make_variants

    class T:
        name = "tiny"

    check_arch_variants(_Learned, make_variants(_Learned, {}, {"topk": [4, 8]}), T())  # inference keys: fine
    with pytest.raises(SpecbenchError) as e:
        check_arch_variants(_Learned, make_variants(_Learned, {}, {"layers": [1, 2]}), T())
    msg = str(e.value)
    assert "variant 'layers=2' changes architecture key(s) layers" in msg
    assert "python cli.py train --method fake --target tiny --set layers=2" in msg and "\n" not in msg


def test_arch_variant_without_weights_is_trained_first(monkeypatch):
    import harness.train.pipeline as pipeline
    from harness.runs.compare import check_arch_variants, make_variants

    class T:
        name = "tiny"

    trained = []
    monkeypatch.setattr(pipeline, "train_method", lambda target, method, overrides, **kw: trained.append(
        (method, overrides, kw["steps"])))
    _Learned.weights_from = None
    check_arch_variants(_Learned, make_variants(_Learned, {}, {"layers": [1, 2]}), T(), train_steps=7)
    assert trained == [("fake", {"layers": 2}, 7)]


def test_discovery_takes_methods_whose_weights_are_found(monkeypatch):
    from rich.console import Console

    from harness.runs.compare import discover_methods
    from methods import registry

    class Found(_Learned):
        name = "eagle"

        @classmethod
        def create(cls, target, overrides, checkpoint=None):
            return object()

    class Buggy(_Learned):
        name = "hydra"

        @classmethod
        def create(cls, target, overrides, checkpoint=None):
            raise RuntimeError("boom")

    class Missing(_Learned):
        name = "medusa"

        @classmethod
        def create(cls, target, overrides, checkpoint=None):
            raise SpecbenchError("no trained weights for 'medusa'\nsecond line")

    class Free:
        name = "lookahead"
        trainable = False
        defaults = {}

    monkeypatch.setattr(registry, "_ENTRIES", {"pld": "methods.pld:PromptLookupDrafter",
                                               "broken": "methods.does_not_exist:X"})
    monkeypatch.setattr(registry, "_CLASSES", {"medusa": Missing, "eagle": Found, "hydra": Buggy,
                                               "lookahead": Free, "gumiho": Found})
    console = Console(record=True, width=200, file=io.StringIO())
    assert discover_methods(object(), {}, console) == ["pld", "eagle", "gumiho"]
    text = console.export_text()
    assert "skipping broken: cannot import it" in text and "skipping hydra: building it failed" in text
    assert "not compared: medusa (no trained weights for 'medusa')" in text and "second line" not in text


@pytest.fixture
def chat_tiny_target():
    """The tiny random Llama with a byte-level 'chat' encoding, so the real grid runs in a second."""
    from tests.conftest import make_tiny_target

    target = make_tiny_target()
    target.encode_chat = lambda messages: [b % 90 + 1 for m in messages for b in m["content"].encode()][:40]
    target.decode = lambda ids: " ".join(map(str, ids))
    return target


def test_ablation_grid_end_to_end_resumes_and_rebuilds(shared_data, tmp_path, chat_tiny_target):
    from rich.console import Console

    from harness.runs.compare import ablation_grid
    from harness.runs.config import RunConfig
    from harness.runs.executor import run_grid

    def spec():
        return RunConfig(methods=None, benchmarks=["mt_bench"], temperatures=[1.0, 0.0], target="tiny",
                         limit=1, max_new_tokens=5, dtype="float32")

    quiet = Console(file=io.StringIO())
    out = tmp_path / "ab"
    def ablate() -> Path:
        cfg, variants, ablation = ablation_grid("pld", ["max_draft=2,10", "adaptive=true,false"], False, spec())
        return run_grid(cfg, out, shared_data, quiet, chat_tiny_target, command="ablate", variants=variants,
                        ablation=ablation)

    run_dir = ablate()
    records = RunDir(run_dir).records()
    # 2 temperatures x 2 MT-Bench turns x (AR + default + max_draft=2 + adaptive=true)
    assert len(records) == 2 * 2 * 4
    assert all(r["lossy"] is False for r in records)  # the runner says whether the rule is lossy
    assert {r["acceptance"] for r in records if r["method"] != "ar"} == {"greedy", "lossless"}
    assert len({r["config_hash"] for r in records}) == 4
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["config"]["command"] == "ablate" and set(meta["config"]["ablation"]["variants"]) == {
        "default", "max_draft=2", "adaptive=true"}
    # Rerunning resumes: nothing new is answered.
    ablate()
    assert len(RunDir(run_dir).records()) == len(records)
    paths = write_report(run_dir)
    assert {"ablation.md", "ablation.png", "cost.md", "depth.csv"} <= {p.name for p in paths}
    md = (run_dir / "tables" / "ablation.md").read_text()
    assert "**Temperature 0 (greedy)**" in md and "| max_draft=2 |" in md


@pytest.mark.parametrize("args,needle", [
    (["compare", "--methods", "pdl"], "unknown method 'pdl'"),
    (["compare", "--methods", "pld", "--benchmarks", "gsm9k"], "unknown benchmark"),
    (["compare", "--methods", "pld", "-t", "0", "-t", "1", "--acceptance", "greedy"], "--acceptance greedy"),
    (["compare", "--methods", "pld", "--preset", "fast"], "unknown preset 'fast'"),
    (["compare", "--methods", "pld", "--set", "max_drafts=3"], "did you mean 'max_draft'"),
    (["compare", "--methods", "pld", "--target", "smollm-135m"], "unknown target"),
    (["ablate", "pld", "--set", "max_draft=3"], "nothing to sweep"),
    (["ablate", "pdl", "--set", "max_draft=3,4"], "unknown method 'pdl'"),
])
def test_bad_compare_and_ablate_options_fail_before_loading(shared_data, args, needle):
    from cli import app

    res = CliRunner().invoke(app, [*args, "--data-dir", str(shared_data)])
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert text.startswith("error:") and len(text.splitlines()) == 1 and needle in text, text
