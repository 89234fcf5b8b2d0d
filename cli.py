"""specbench command line: `python cli.py COMMAND --help` (or the `specbench` console script)."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.core.stopping import INTERRUPTED, interrupt_on_stop_signals
from harness.runs.benchmarks import BENCHMARKS

if TYPE_CHECKING:
    from harness.runs.config import RunConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark speculative decoders on one common code path.")
console = Console(width=None if sys.stdout.isatty() else 200)  # files and pipes get whole tables
err = Console(stderr=True)


@app.callback()
def main() -> None:
    """Benchmark speculative decoders on one common code path."""
    from harness.core.allocator import keep_freed_memory

    keep_freed_memory()  # big tensors reuse heap memory instead of being page-faulted in anew
    interrupt_on_stop_signals()  # `kill PID` saves a training's resume state like Ctrl-C


# Options shared by several commands, declared once; each command gives the default.
TargetOpt = Annotated[str, typer.Option(help="alias, HF dir, .gguf file or hub id")]
DtypeOpt = Annotated[str, typer.Option(help="target dtype: auto | float32 | bfloat16 | float16")]
DeviceOpt = Annotated[str, typer.Option(help="where the target runs: auto | cpu | cuda")]
DeviceMapOpt = Annotated[Optional[str], typer.Option(
    help="auto: shard the target over every GPU (accelerate); the drafter sits with the LM head")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile", help="compiled runtime for the target (AR and every method) and the drafters' own "
    "decoder layers (torch.compile max-autotune; the first run on a machine compiles for minutes)")]
DataDirOpt = Annotated[Optional[Path], typer.Option(help="folder with <benchmark>/question.jsonl (default: $SPECBENCH_DATA)")]
RunDirOpt = Annotated[Optional[Path], typer.Option(help="run folder (default results/runs/<config hash>)")]
MaxNewTokensOpt = Annotated[int, typer.Option(help="new tokens per answer (per turn)")]
SeedOpt = Annotated[int, typer.Option(help="base of the per-answer sampling seeds")]
TopPOpt = Annotated[float, typer.Option(help="nucleus sampling: keep the most likely tokens up to this mass")]
SettingsOpt = Annotated[list[str], typer.Option(
    "--set", help="method config key=value, repeatable (JSON values; method.key=value for one method; "
                  "ablate sweeps key=v1,v2,...)")]
TreeBudgetOpt = Annotated[Optional[str], typer.Option(
    help="draft tokens per verify for every tree method (N), or auto: sized for this machine's verify "
         "cost; default: each method's own (EAGLE's fixed 25-node tree, the others auto)")]
ChatTemplateOpt = Annotated[Optional[str], typer.Option(help="'vicuna' or a Jinja template, for targets without one")]
SystemPromptOpt = Annotated[Optional[str], typer.Option(help="system message put before every conversation")]
MethodOpt = Annotated[str, typer.Option("--method", "-m", help="one method (see `cli.py list`)")]
CheckpointOpt = Annotated[Optional[str], typer.Option(help="drafter weights: folder or hub id")]
ThreadsOpt = Annotated[int, typer.Option(help="torch threads (0 = torch's default)")]
DistillDataOpt = Annotated[list[Path], typer.Option(
    help="distill folder, repeatable (default datasets/distill/<target>; add datasets/distill/<target>-followups "
         "for second turns)")]
PromptsOpt = Annotated[Path, typer.Option(help="prompt file the distill ids refer to")]
ShardsOpt = Annotated[Optional[int], typer.Option(
    help="use only the first N distill shards (the reference weights used 24)")]
CiOpt = Annotated[bool, typer.Option("--ci", help="bootstrap 95% intervals in the markdown table too")]
AllowDirtyOpt = Annotated[bool, typer.Option("--allow-dirty", help="accept a run made from uncommitted changes")]
RunFolderArg = Annotated[Path, typer.Argument(help="a run folder")]
SkipInvalidOpt = Annotated[bool, typer.Option(
    "--skip-invalid", help="leave out records whose fields disagree (counted in the captions) instead of refusing")]
# run / compare / ablate: what a run answers (harness.runs.config.RunConfig)
MethodsOpt = Annotated[Optional[str], typer.Option(
    "--methods", "--method", "-m", help="methods beside AR, comma-separated (compare without it: pld + every "
                                        "method whose trained weights are found)")]
BenchmarksOpt = Annotated[str, typer.Option(
    "--benchmarks", "--benchmark", "-b", help="benchmark names or prompt files (a question.jsonl in the EAGLE/Spec-Bench "
                                              "format, named by its folder or NAME=PATH), comma-separated")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "-t", help="sampling temperature (0: greedy)")]
TemperaturesOpt = Annotated[list[float], typer.Option(
    "--temperature", "-t", help="sampling temperature (0: greedy), repeatable: one table block per value")]
AcceptanceOpt = Annotated[Optional[str], typer.Option(
    help="rule at T > 0: lossless (default) | typical (lossy, labelled); T = 0 is greedy")]
LimitOpt = Annotated[Optional[int], typer.Option(
    help="questions per benchmark, spread evenly over categories (run without it: all)")]
PresetOpt = Annotated[Optional[str], typer.Option(
    help="'paper': all 80 questions and 512 tokens (for GPUs), where --limit / --max-new-tokens are not given")]
RayOpt = Annotated[bool, typer.Option("--ray", help="run the grid's cells as Ray tasks (pip install ray)")]
RayAddressOpt = Annotated[Optional[str], typer.Option(help="Ray cluster address (default: start a local Ray)")]
PackOpt = Annotated[bool, typer.Option("--pack", help="with --ray: untimed CPU cells share a node, one CPU and "
                                                      "one thread each (tau and outputs only)")]


def friendly(fn):
    """User errors become one red line and exit code 2; tracebacks are kept for bugs."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecbenchError as e:
            err.print(f"[red]error:[/] {e}", soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] {INTERRUPTED}")
            raise typer.Exit(130)
    return wrapper


def set_threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


def split_csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


PRESETS = {"paper": {"limit": None, "max_new_tokens": 512}}  # all 80 questions, 512 tokens (GPUs)


def run_config(ctx: typer.Context, *, methods: Optional[list[str]], benchmarks: str, temperatures: list[float],
               settings: list[str], tree_budget: Optional[str], preset: Optional[str] = None,
               ids: Optional[str] = None, **fields: object) -> RunConfig:
    """The RunConfig of `run`, `compare` or `ablate`, built once from their options and checked as
    it is built: `--preset` fills --limit / --max-new-tokens left at their default; `fields` are
    RunConfig fields taken as given (target, dtype, limit, seed, ...)."""
    from harness.runs.benchmarks import parse_benchmarks
    from harness.runs.config import RunConfig
    from harness.runs.settings import parse_settings

    if preset is not None:
        if preset not in PRESETS:
            from harness.core.errors import unknown

            raise unknown("preset", preset, PRESETS)
        fields.update({k: v for k, v in PRESETS[preset].items() if ctx.get_parameter_source(k).name == "DEFAULT"})
    names, files = parse_benchmarks(split_csv(benchmarks))
    return RunConfig(methods=methods, benchmarks=names, prompt_files={n: f.as_config() for n, f in files.items()},
                     temperatures=temperatures, ids=[int(i) for i in split_csv(ids)] if ids else None,
                     settings=parse_settings(settings, tree_budget), **fields)


@app.command()
@friendly
def run(
    ctx: typer.Context,
    method: MethodsOpt,
    benchmark: BenchmarksOpt = "mt_bench",
    temperature: TemperatureOpt = 0.0,
    target: TargetOpt = "smollm2-135m",
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    device_map: DeviceMapOpt = None,
    compile_: CompileOpt = False,
    limit: LimitOpt = None,
    ids: Annotated[Optional[str], typer.Option(help="explicit question ids, comma-separated")] = None,
    max_new_tokens: MaxNewTokensOpt = 128,
    top_p: TopPOpt = 1.0,
    acceptance: AcceptanceOpt = None,
    seed: SeedOpt = 0,
    checkpoint: CheckpointOpt = None,
    set_: SettingsOpt = [],
    tree_budget: TreeBudgetOpt = None,
    chat_template: ChatTemplateOpt = None,
    system_prompt: SystemPromptOpt = None,
    data_dir: DataDirOpt = None,
    out: RunDirOpt = None,
):
    """Run methods and AR on the same prompts; write records.jsonl, meta.json and summary.csv. Resumes."""
    from harness.runs.executor import run_folder, run_grid, summarize_dir
    from harness.runs.folder_lock import hold

    cfg = run_config(ctx, methods=split_csv(method), benchmarks=benchmark, temperatures=[temperature], settings=set_,
                     tree_budget=tree_budget, ids=ids, target=target, dtype=dtype, device=device,
                     device_map=device_map, compile=compile_, limit=limit, max_new_tokens=max_new_tokens, top_p=top_p,
                     acceptance=acceptance, seed=seed, checkpoint=checkpoint, chat_template=chat_template,
                     system_prompt=system_prompt)
    with hold(run_folder(cfg, out)):   # the folder's one writer from here to the summary
        path = run_grid(cfg, out, data_dir, err)   # a grid of one temperature; meta.json stores the RunConfig
        print_summary(summarize_dir(path))
    console.print(f"run folder: {path}")


def print_summary(df) -> None:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    cols = ["method", "benchmark", "temperature", "acceptance", "answers", "new_tokens", "tau", "speedup",
            "tokens_per_s", "draft_ms_per_step", "verify_ms_per_step", "mismatches", "mismatches_near_tie"]
    for c in cols:
        table.add_column(c.replace("_per_", "/").replace("mismatches_near_tie", "near-tie"))
    for _, row in df.iterrows():
        table.add_row(*[f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in cols])
    console.print(table, width=max(console.width, 200))  # never squeeze the numbers into ellipses


@app.command()
@friendly
def summary(run_dir: RunFolderArg):
    """Rebuild summary.csv of a run folder from its records.jsonl."""
    from harness.runs.executor import summarize_dir

    print_summary(summarize_dir(run_dir))


def print_markdown(path: Path) -> None:
    """A table file as it is (no wrapping, no markup), so it pastes into a README."""
    console.print(path.read_text(), markup=False, highlight=False, soft_wrap=True)


def print_written(run_dir: Path, paths: list[Path]) -> None:
    tables = sorted({p.name for p in paths if p.parent.name == "tables"})
    plots = sorted({p.stem for p in paths if p.parent.name == "plots"})
    if tables:
        console.print(f"tables: {run_dir / 'tables'}/ ({', '.join(tables)})")
    if plots:
        console.print(f"plots: {run_dir / 'plots'}/ ({', '.join(plots)}; .png and .svg)")


@app.command()
@friendly
def compare(
    ctx: typer.Context,
    methods: MethodsOpt = None,
    benchmarks: BenchmarksOpt = ",".join(BENCHMARKS),
    temperature: TemperaturesOpt = [0.0],
    target: TargetOpt = "smollm2-135m",
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    device_map: DeviceMapOpt = None,
    compile_: CompileOpt = False,
    acceptance: AcceptanceOpt = None,
    typical: Annotated[Optional[str], typer.Option(
        help="methods that also run Medusa's typical rule (lossy, labelled) at each T > 0, e.g. medusa,hydra")] = None,
    set_: SettingsOpt = [],
    tree_budget: TreeBudgetOpt = None,
    data_dir: DataDirOpt = None,
    limit: LimitOpt = 10,
    max_new_tokens: MaxNewTokensOpt = 128,
    preset: PresetOpt = None,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    chat_template: ChatTemplateOpt = None,
    system_prompt: SystemPromptOpt = None,
    out: RunDirOpt = None,
    ci: CiOpt = False,
    record: Annotated[bool, typer.Option("--record", help="append one line per cell to the history file")] = False,
    history_file: Annotated[Optional[Path], typer.Option(
        "--history", help="history file for --record (default results/history.jsonl)")] = None,
    allow_dirty: AllowDirtyOpt = False,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    pack: PackOpt = False,
):
    """AR and every method on the same prompts over benchmarks x temperatures; tables and plots. Resumes."""
    from harness.report.run_readme import write_report
    from harness.runs.backends import make_backend
    from harness.runs.executor import run_folder, run_grid, summarize_dir
    from harness.runs.folder_lock import hold

    cfg = run_config(ctx, methods=split_csv(methods) if methods else None, benchmarks=benchmarks,
                     temperatures=temperature, settings=set_, tree_budget=tree_budget, preset=preset, target=target,
                     dtype=dtype, device=device, device_map=device_map, compile=compile_, limit=limit,
                     max_new_tokens=max_new_tokens, top_p=top_p, acceptance=acceptance, seed=seed,
                     chat_template=chat_template, system_prompt=system_prompt,
                     typical=split_csv(typical) if typical else [])
    with hold(run_folder(cfg, out, "compare")):   # the folder's one writer from here to the report
        run_dir = run_grid(cfg, out, data_dir, err, command="compare",
                           backend=make_backend(ray, ray_address, pack))
        print_summary(summarize_dir(run_dir))
        paths = write_report(run_dir, ci)
        print_markdown(run_dir / "tables" / "main.md")
        print_written(run_dir, paths)
        if record:
            from harness.runs.history import HISTORY_FILE, record_history

            n = record_history(run_dir, history_file or HISTORY_FILE, allow_dirty)
            console.print(f"history: {n} cells appended to {history_file or HISTORY_FILE}")
    console.print(f"run folder: {run_dir}")


@app.command()
@friendly
def ablate(
    ctx: typer.Context,
    method: Annotated[str, typer.Argument(help="the method whose config is swept")],
    set_: SettingsOpt,
    grid: Annotated[bool, typer.Option("--grid", help="every combination instead of one factor at a time")] = False,
    benchmarks: BenchmarksOpt = "mt_bench",
    temperature: TemperaturesOpt = [0.0],
    target: TargetOpt = "smollm2-135m",
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    compile_: CompileOpt = False,
    acceptance: AcceptanceOpt = None,
    tree_budget: TreeBudgetOpt = None,
    data_dir: DataDirOpt = None,
    limit: LimitOpt = 10,
    max_new_tokens: MaxNewTokensOpt = 128,
    preset: PresetOpt = None,
    seed: SeedOpt = 0,
    out: RunDirOpt = None,
    ci: CiOpt = False,
    train_steps: Annotated[int, typer.Option(
        help="budget for training a variant whose architecture has no weights yet (0: refuse instead)")] = 1500,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    pack: PackOpt = False,
):
    """Sweep drafter config keys one factor at a time around the defaults (--grid: full product), beside AR."""
    from harness.report.run_readme import write_report
    from harness.runs.backends import make_backend
    from harness.runs.compare import ablation_grid
    from harness.runs.executor import run_folder, run_grid
    from harness.runs.folder_lock import hold

    cfg = run_config(ctx, methods=[method], benchmarks=benchmarks, temperatures=temperature, settings=[],
                     tree_budget=None, preset=preset, target=target, dtype=dtype, device=device, compile=compile_,
                     limit=limit, max_new_tokens=max_new_tokens, acceptance=acceptance, seed=seed)
    cfg, variants, ablation = ablation_grid(method, set_, grid, cfg, tree_budget)
    with hold(run_folder(cfg, out, "ablate", ablation)):   # the folder's one writer from here to the report
        run_dir = run_grid(cfg, out, data_dir, err, command="ablate", variants=variants, ablation=ablation,
                           train_steps=train_steps, backend=make_backend(ray, ray_address, pack))
        paths = write_report(run_dir, ci)
    print_markdown(run_dir / "tables" / "ablation.md")
    print_written(run_dir, paths)
    console.print(f"run folder: {run_dir}")


@app.command()
@friendly
def table(run_dir: RunFolderArg, ci: CiOpt = False, skip_invalid: SkipInvalidOpt = False):
    """Rebuild DIR/tables/ (main or ablation, cost, depth: .md .tex .csv) from records.jsonl."""
    from harness.report.run_readme import write_report

    paths = write_report(run_dir, ci, plots=False, skip_invalid=skip_invalid)
    print_markdown(paths[0])
    print_written(run_dir, paths)


@app.command()
@friendly
def plot(run_dir: RunFolderArg, skip_invalid: SkipInvalidOpt = False):
    """Rebuild DIR/plots/ (speedup, tau, depth, time [, ablation]: .png .svg) from records.jsonl."""
    from harness.report.run_readme import write_report

    print_written(run_dir, write_report(run_dir, tables=False, skip_invalid=skip_invalid))


@app.command()
@friendly
def curves(checkpoints: Annotated[list[Path], typer.Argument(help="checkpoint folders `train` wrote")],
           out: Annotated[Path, typer.Option(help="folder for training-curves.md/.png/.svg")]):
    """Held-out top-1 over training for each checkpoint (a table and a plot): has the budget flattened?"""
    from harness.report.plots import plot_training_curves
    from harness.report.training_curves import curves_markdown, read_curves

    frame = read_curves(checkpoints)
    out.mkdir(parents=True, exist_ok=True)
    (out / "training-curves.md").write_text(curves_markdown(frame))
    written = [out / "training-curves.md", *plot_training_curves(frame, out)]
    console.print("wrote " + ", ".join(str(p) for p in written))


@app.command()
@friendly
def baseline(run_dir: RunFolderArg,
             save: Annotated[Path, typer.Option("--save", help="baseline JSON to write (e.g. results/baselines/X.json)")],
             allow_dirty: AllowDirtyOpt = False,
             methods: Annotated[Optional[str], typer.Option(
                 help="comma-separated methods to keep (names in the run, or `module:Class`; default: all)")] = None):
    """Store per-cell τ and per-depth acceptance of a run, with its provenance, as a baseline."""
    from harness.runs.regress import save_baseline

    data = save_baseline(run_dir, save, allow_dirty, split_csv(methods) if methods else None)
    console.print(f"baseline: {len(data['cells'])} cells from {run_dir} -> {save}")


@app.command()
@friendly
def regress(
    run_dir: RunFolderArg,
    baseline_file: Annotated[Path, typer.Option("--baseline", help="a file written by `cli.py baseline`")],
    tolerance: Annotated[float, typer.Option(help="allowed relative drop of τ")] = 0.02,
    depth_tolerance: Annotated[Optional[float], typer.Option(
        help="allowed relative drop of each depth's acceptance (default: --tolerance)")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="also write the verdict as JSON here")] = None,
):
    """Compare a run's τ and per-depth acceptance with a baseline per cell: exit 0 ok, 1 on a drop or
    missing cell, 2 if not comparable."""
    from rich.table import Table

    from harness.runs.regress import cell_name, check, describe_moves, write_verdict

    verdict = check(run_dir, baseline_file, tolerance, depth_tolerance)
    console.print(f"baseline machine: {verdict.machines['baseline']}; run machine: {verdict.machines['run']}")
    for w in verdict.warnings:
        err.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    if report:
        write_verdict(verdict, report, run_dir, baseline_file)
    shown = verdict.failed or [r for r in verdict.rows if r["status"] == "improved"]
    if shown:
        t = Table(show_header=True, header_style="bold")
        for c in ("method", "benchmark", "T", "rule", "base τ", "run τ", "Δτ", "depths moved", "status"):
            t.add_column(c)
        for r in shown:
            depths = ", ".join(f"d{m['depth']} {100 * m['change']:+.1f}%" for m in r["depths"]) or "–"
            t.add_row(r["method"], r["benchmark"], f"{r['temperature']:g}", r["acceptance"], f"{r['baseline_tau']:.4f}",
                      "–" if r["tau"] is None else f"{r['tau']:.4f}",
                      "–" if r["change"] is None else f"{100 * r['change']:+.1f}%", depths,
                      f"[red]{r['status']}[/]" if r["status"] in ("dropped", "missing") else r["status"])
        console.print(t)
    n = len(verdict.rows)
    tol = f"{100 * tolerance:g}% (τ), {100 * verdict.depth_tolerance:g}% (each depth)"
    for r in shown:
        label = "[red]regressed:[/]" if r in verdict.failed else "improved:"
        console.print(f"{label} {cell_name(r)}: {'; '.join(describe_moves(r))}", soft_wrap=True)
    if verdict.failed:
        console.print(f"{len(verdict.failed)} of {n} cells failed (tolerance {tol})")
        raise typer.Exit(1)
    console.print(f"ok: {n} cells within {tol} of {baseline_file}")


@app.command()
@friendly
def history(
    history_file: Annotated[Optional[Path], typer.Option(
        "--file", help="history file to plot (default results/history.jsonl)")] = None,
    target: Annotated[Optional[str], typer.Option(
        help="target whose lines are plotted (default: the latest line's)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="dtype whose lines are plotted (default: the latest line's)")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="tokens per answer of the lines plotted (default: the latest line's)")] = None,
    temperature: Annotated[float, typer.Option(help="temperature whose cells are plotted")] = 0.0,
    benchmark: Annotated[Optional[str], typer.Option(help="one benchmark (default: mean over benchmarks)")] = None,
    tolerance: Annotated[float, typer.Option(
        help="relative change from a method's previous commit that is marked as a move")] = 0.02,
    out: Annotated[Optional[Path], typer.Option(help="folder for history.png/.svg (default: beside the file)")] = None,
):
    """Plot τ and depth-1 acceptance over commits per method, marking the commits where they moved."""
    from rich.table import Table

    from harness.report.plots import plot_history
    from harness.runs.folder_lock import hold
    from harness.runs.history import HISTORY_FILE, history_frame, history_moves

    file = history_file or HISTORY_FILE
    frame = history_frame(file, target, dtype, temperature, benchmark, max_new_tokens, tolerance)
    t = Table(show_header=True, header_style="bold")
    frame = frame.assign(cell=[f"{'*' if m else ''}{v:.4f}" + (f" ({d:.3f})" if d == d else "") for v, d, m in
                               zip(frame["tau"], frame["depth1"], frame["tau_moved"] | frame["depth1_moved"])])
    pivot = frame.pivot(index=["order", "commit"], columns="label", values="cell").sort_index()
    pivot = pivot[list(dict.fromkeys(frame.sort_values(["rank", "label"])["label"]))]  # methods in table order
    t.add_column("commit")
    for m in pivot.columns:
        t.add_column(f"{m} τ (depth 1)")
    for (_, commit), row in pivot.iterrows():
        t.add_row(str(commit)[:7], *["–" if not isinstance(v, str) else v for v in row])
    console.print(t)
    moves = history_moves(frame)
    console.print(f"* moved more than {100 * tolerance:g}% from the method's previous commit"
                  + (":" if moves else ": none"))
    for line in moves:
        console.print(f"  {line}", soft_wrap=True)
    first = frame.iloc[0]
    setting = f"{first['target']}, {first['dtype']}, {first['max_new_tokens']} tokens, T={temperature:g}"
    with hold(out or file.parent, "--out"):   # the plots' folder: one writer
        paths = plot_history(frame, out or file.parent, benchmark, setting=setting, tolerance=tolerance)
    console.print(f"plot: {', '.join(map(str, paths))}")


@app.command("list")
@friendly
def list_():
    """Methods (built-in and installed plugins, with what each declares), benchmarks and target aliases."""
    from rich.table import Table

    from harness.core.model_wheels import WHEEL_MODELS
    from harness.runs.benchmarks import BENCHMARKS
    from methods.registry import method_info, method_names

    table = Table(title="methods (any package.module:Class Drafter is accepted too)", title_justify="left")
    for col in ("name", "method", "paper", "trained", "acceptance", "from", "what it does"):
        table.add_column(col)
    infos = sorted((method_info(n) for n in ["ar", *method_names()]), key=lambda i: (i.order, i.name))
    for i in infos:
        paper = i.paper + (f" ({i.year})" if i.year and str(i.year) not in i.paper else "")
        table.add_row(i.name, f"[{i.color}]■[/] {i.display_name}" if i.color else i.display_name, paper,
                      "yes" if i.trainable else "no", ", ".join(i.acceptance_rules) if i.name != "ar" else "-",
                      i.source, i.summary)
    console.print(table)
    console.print("[bold]benchmarks[/]: " + ", ".join(BENCHMARKS))
    console.print("[bold]target aliases[/]: " + ", ".join(WHEEL_MODELS))


@app.command("check-method")
@friendly
def check_method_cmd(
    method: Annotated[str, typer.Argument(help="a method name (see `cli.py list`) or package.module:Class of a Drafter")],
    target: Annotated[str, typer.Option(help="smollm2-135m, tiny (random 2-layer Llama, random token prompts) "
                                        "or any target alias, HF dir, .gguf file or hub id")] = "smollm2-135m",
    dtype: DtypeOpt = "float32",
    device: DeviceOpt = "cpu",
    data_dir: DataDirOpt = None,
    prompts: Annotated[int, typer.Option(help="greedy prompts per benchmark (first questions)")] = 2,
    max_new_tokens: MaxNewTokensOpt = 48,
    law_samples: Annotated[int, typer.Option(help="samples of the first speculative step at T>0 for the law check")] = 1000,
    tree_budget: Annotated[str, typer.Option(help="the large of the two budgets (draft tokens per verify) the drafter "
                                             "runs with and is held to, auto, or none: as configured")] = "15",
    checkpoint: CheckpointOpt = None,
    random_init: Annotated[bool, typer.Option("--random-init", help="check random (seeded) weights instead of "
                                              "trained ones (always so on the tiny target)")] = False,
    set_: SettingsOpt = [],
    seed: SeedOpt = 0,
    threads: ThreadsOpt = 0,
):
    """Conformance check of one drafter on one target: config keys, greedy output = AR, the tree
    budget, edge cases, the draft law q, the output law at T>0, the tree contract,
    begin/propose/observe across resumed answers, checkpoint round trip, draft time; prints a card
    and exits 0 only if every check passes (1 otherwise)."""
    from harness.runs.check_method import CheckOptions, check_method, render_card
    from harness.runs.settings import check_settings, method_overrides, parse_settings, parse_tree_budget
    from methods.registry import get_method

    set_threads(threads)
    cls = get_method(method)
    settings = parse_settings(set_)
    check_settings(settings, {method: cls})
    budget = None if tree_budget == "none" else parse_tree_budget(tree_budget)
    opts = CheckOptions(target=target, dtype=dtype, device=device, data_dir=data_dir, prompts=prompts,
                        max_new_tokens=max_new_tokens, law_samples=law_samples, tree_budget=budget,
                        settings=method_overrides(cls, settings, [method]), checkpoint=checkpoint,
                        random_init=True if random_init else None, seed=seed)
    card = check_method(method, opts)
    for part in render_card(card):
        console.print(part)
    raise typer.Exit(0 if card.passed else 1)


@app.command("fetch-data")
@friendly
def fetch_data(dest: Annotated[Path, typer.Argument(help="folder to write <benchmark>/question.jsonl into")],
               force: Annotated[bool, typer.Option(help="download even when a verified copy is present")] = False):
    """Download the six EAGLE-format question files and check their SHA-256."""
    from urllib.request import urlopen

    from harness.runs.benchmarks import fetch_data as fetch

    paths = fetch(dest, opener=lambda url: urlopen(url, timeout=60), force=force,
                  notify=lambda line: err.print(f"[yellow]warning:[/] {line}", soft_wrap=True))
    for p in paths:
        console.print(f"ok {p}")


@app.command()
@friendly
def bench(
    target: TargetOpt = "smollm2-135m",
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    contexts: Annotated[str, typer.Option(help="context lengths for the cost curve")] = "256,1536",
    sizes: Annotated[str, typer.Option(help="tree tokens per forward")] = "1,2,4,8,16,32,64",
    repeats: Annotated[int, typer.Option(
        help="timed repeats per measurement, the median kept (contests run max(3, N/2) rounds)")] = 7,
    ar_prompts: Annotated[int, typer.Option(help="MT-Bench prompts for AR vs HF generate (0 = skip)")] = 3,
    max_new_tokens: MaxNewTokensOpt = 64,
    pld: Annotated[bool, typer.Option("--pld", help="also: our pld vs HF prompt lookup per benchmark")] = False,
    assisted: Annotated[Optional[str], typer.Option(
        "--assisted", help="also: our sps with this draft model (alias, HF dir or .gguf) vs HF assisted generation "
                           "per benchmark")] = None,
    contest_benchmarks: Annotated[str, typer.Option(
        "--contest-benchmarks", "--pld-benchmarks", help="benchmarks of the --pld / --assisted contests")
    ] = "mt_bench,humaneval,gsm8k,cnn_dm",
    contest_prompts: Annotated[int, typer.Option(
        "--contest-prompts", "--pld-prompts", help="first-turn prompts per benchmark")] = 3,
    data_dir: DataDirOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="write the results as JSON here")] = None,
    compile_: CompileOpt = False,
):
    """Cost curve of a k-token forward, our AR loop vs HF generate, (--pld) pld vs HF prompt lookup,
    (--assisted DRAFT) sps vs HF assisted generation."""
    from harness.runs.bench import run_bench

    run_bench(target=target, dtype=dtype, device=device, contexts=[int(c) for c in split_csv(contexts)],
              sizes=[int(s) for s in split_csv(sizes)], repeats=repeats, ar_prompts=ar_prompts,
              max_new_tokens=max_new_tokens, pld=pld, contest_benchmarks=split_csv(contest_benchmarks),
              contest_prompts=contest_prompts, data_dir=data_dir, out=out, console=console, assisted=assisted,
              compile_=compile_)


@app.command()
@friendly
def distill(
    prompts: Annotated[Path, typer.Option(
        help="training prompts jsonl ({id, category, prompt}); never a benchmark file")],
    target: TargetOpt = "smollm2-135m",
    n: Annotated[Optional[int], typer.Option(help="cap on prompts after the mix")] = None,
    samples: Annotated[int, typer.Option(help="responses per prompt: 1 greedy + samples-1 sampled")] = 2,
    greedy: Annotated[bool, typer.Option(
        help="ask the greedy response too; --no-greedy: sampled ones only, for more data beside a folder that has them")
    ] = True,
    seed: Annotated[int, typer.Option(help="plan seed: the math subsample, the follow-ups drawn, the samples")] = 0,
    max_new_tokens: MaxNewTokensOpt = 384,
    batch_size: Annotated[int, typer.Option(help="conversations generated together in one batch")] = 32,
    shard_size: Annotated[int, typer.Option(
        help="conversations per shard file (the unit of resuming; part of the plan hash)")] = 96,
    max_shards: Annotated[Optional[int], typer.Option(
        help="stop after this many new shards (spread work over runs)")] = None,
    max_prompt_tokens: Annotated[int, typer.Option(
        help="skip conversations whose prompt (with earlier turns) is longer")] = 768,
    followups: Annotated[Optional[Path], typer.Option(
        help="second turns: answer these follow-ups (e.g. datasets/followups.jsonl) to the greedy answers of --base")
    ] = None,
    base: Annotated[Optional[str], typer.Option(
        help="with --followups: the distill folder continued (default <target>)")] = None,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    out: Annotated[Optional[Path], typer.Option(
        help="folder for the shards (default datasets/distill/<target>[-followups][-seedN][-sampled])")] = None,
    threads: ThreadsOpt = 0,
):
    """Have the target answer training prompts (or follow-ups to its own answers); commit-ready
    token ids, resumable shard by shard."""
    from rich.progress import Progress

    from harness.core.target import Target
    from harness.train.distill import DistillPlan, read_followups
    from harness.train.distill import distill as run_distill

    set_threads(threads)
    turn2 = {"base": base or target, "followups": read_followups(followups)} if followups else {}
    plan = DistillPlan(str(prompts), n=n, samples=samples, greedy=greedy, max_new_tokens=max_new_tokens,
                       max_prompt_tokens=max_prompt_tokens, shard_size=shard_size, seed=seed, **turn2)
    tgt = Target.load(target, device, dtype)
    name = target + ("-followups" if followups else "") + (f"-seed{seed}" if seed else "") + ("" if greedy else "-sampled")
    out = out or Path(__file__).resolve().parent / "datasets" / "distill" / name
    with Progress(console=err) as progress:
        res = run_distill(tgt, prompts, out, plan, batch_size=batch_size, max_shards=max_shards, progress=progress)
    console.print(res)


datastore_app = typer.Typer(no_args_is_help=True, help="REST's datastore (also SAM-Decoding's static corpus)")
app.add_typer(datastore_app, name="datastore")


@datastore_app.command("build")
@friendly
def datastore_build(
    from_: Annotated[list[str], typer.Option(
        "--from", help="what to index, repeatable: 'default' (the training prompts + this target's distilled "
                       "answers), a JSONL file or folder of texts, or a distill folder")] = ["default"],
    target: TargetOpt = "smollm2-135m",
    name: Annotated[Optional[str], typer.Option(
        help="cache name, used as --set rest.datastore=NAME (default: 'default', for the default corpus only)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write to this folder instead of the cache")] = None,
    prompts: PromptsOpt = Path("../shared/data/train_prompts/prompts.jsonl"),
    force: Annotated[bool, typer.Option(help="rebuild even when an up-to-date one is cached")] = False,
):
    """Build the token index REST retrieves from and SAM-Decoding's static automaton matches
    against; cached per target, rebuilt only when its sources change."""
    from harness.core.target import Target
    from harness.train.datastore import build_datastore

    tgt = Target.load(target, "cpu", "float32")
    with console.status("building the datastore"):
        folder, meta, built = build_datastore(tgt, from_, name, out, prompts, force)
    size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
    state = f"built in {meta.get('build_s')} s" if built else "up to date (--force rebuilds it)"
    console.print(f"{folder}: {meta['documents']:,} documents, {meta['tokens']:,} tokens, {size:.1f} MB; {state}")


@app.command()
@friendly
def train(
    method: MethodOpt,
    target: TargetOpt = "smollm2-135m",
    data: DistillDataOpt = [],
    prompts: PromptsOpt = Path("../shared/data/train_prompts/prompts.jsonl"),
    steps: Annotated[int, typer.Option(help="optimiser steps (the same budget for every method by default)")] = 1500,
    lr: Annotated[Optional[float], typer.Option(help="peak learning rate (default: the method's own)")] = None,
    tokens_per_batch: Annotated[int, typer.Option(
        help="padded tokens per optimiser step (length-bucketed batches)")] = 4096,
    max_len: Annotated[int, typer.Option(
        help="longest training sequence in tokens; longer conversations keep their last N")] = 1024,
    set_: SettingsOpt = [],
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    autocast: Annotated[str, typer.Option(
        help="bf16 mixed precision in training: auto (on GPUs and CPUs with fast bf16) | bf16 | off")] = "auto",
    out: Annotated[Optional[Path], typer.Option(
        help="checkpoint folder to write (default checkpoints/<target>/<method>[-<arch hash>])")] = None,
    init_from: Annotated[Optional[Path], typer.Option(
        help="warm-start from this finished checkpoint (same architecture): a new schedule cycle, its steps counted "
             "in the total")] = None,
    shards: ShardsOpt = None,
    train_share: Annotated[float, typer.Option(
        help="train on this share of the training conversations (nested; the held-out set stays whole): "
             "the data curve")] = 1.0,
    commit_every: Annotated[float, typer.Option(
        help="minutes between git commits of --out (weights, resume state, log) for a training that spans "
             "sessions on machines that may change; 0: never")] = 0.0,
    threads: ThreadsOpt = 0,
):
    """Train a drafter on the shared distilled data (the target's features are extracted at --dtype and
    cached first). Resumes."""
    from harness.core.target import Target
    from harness.runs.settings import parse_settings
    from harness.train.data import check_train_share
    from harness.train.pipeline import train_method
    from methods.registry import get_method

    set_threads(threads)
    cls = get_method(method)
    if not cls.trainable:
        raise SpecbenchError(f"method '{method}' is training-free: there is nothing to train")
    overrides = parse_settings(set_)
    cls.resolve_config(overrides)  # unknown keys fail before the target loads
    check_train_share(train_share)  # before the target loads
    tgt = Target.load(target, device, dtype)
    result = train_method(tgt, method, overrides, steps=steps, lr=lr, data=data, prompts=prompts,
                          tokens_per_batch=tokens_per_batch, max_len=max_len, autocast=autocast, out=out,
                          init_from=init_from, console=err, shards=shards, train_share=train_share,
                          commit_every_s=60.0 * commit_every)
    console.print_json(data=result)


@app.command()
@friendly
def peers(
    ctx: typer.Context,
    names: Annotated[Optional[str], typer.Option(
        "--peers", "-p", help="official implementations to run beside ours, comma-separated (see --list)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the peers and exit")] = False,
    benchmarks: BenchmarksOpt = "mt_bench,gsm8k",
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="one sampling temperature")] = 0.0,
    target: TargetOpt = "smollm2-135m",
    dtype: DtypeOpt = "float32",
    data_dir: DataDirOpt = None,
    limit: LimitOpt = 10,
    max_new_tokens: MaxNewTokensOpt = 128,
    seed: SeedOpt = 0,
    peer_root: Annotated[Path, typer.Option(help="folder holding the peers' code, unmodified")] = Path("../shared/peers"),
    ours: Annotated[bool, typer.Option("--ours/--no-ours", help="also run our methods with the peers' settings")] = True,
    threads: ThreadsOpt = 1,
    out: RunDirOpt = None,
):
    """Ours and the official implementations side by side: same target, weights and prompt ids, each
    peer in its own environment (`bash scripts/setup_peers.sh`); tables with both. Resumes."""
    from harness.peers.catalog import PEERS
    from harness.peers.runner import run_peers
    from harness.report.run_readme import write_report
    from harness.runs.executor import summarize_dir

    if list_:
        for p in PEERS.values():
            console.print(f"{p.name:24} {p.label:28} {p.folder} (transformers {p.transformers})")
        return
    if not names:
        raise typer.BadParameter("name the peers to run (--peers a,b; see --list)", param_hint="--peers")
    set_threads(threads)
    cfg = run_config(ctx, methods=None, benchmarks=benchmarks, temperatures=[temperature], settings=[],
                     tree_budget=None, preset=None, target=target, dtype=dtype, device="cpu", device_map=None,
                     compile=False, limit=limit, max_new_tokens=max_new_tokens, top_p=1.0, acceptance=None, seed=seed,
                     chat_template=None, system_prompt=None, typical=[])
    run_dir = run_peers(split_csv(names), cfg, out or Path("results/runs/peers"), data_dir, peer_root, err, threads,
                        ours)
    print_summary(summarize_dir(run_dir))
    paths = write_report(run_dir, False)
    print_markdown(run_dir / "tables" / "main.md")
    print_written(run_dir, paths)
    console.print(f"run folder: {run_dir}")


@app.command()
@friendly
def features(
    method: MethodOpt,
    target: TargetOpt = "smollm2-135m",
    data: DistillDataOpt = [],
    prompts: PromptsOpt = Path("../shared/data/train_prompts/prompts.jsonl"),
    set_: SettingsOpt = [],
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    shards: ShardsOpt = None,
    threads: ThreadsOpt = 0,
):
    """Extract (or finish extracting) the target features METHOD trains on into the cache, shard by
    shard, without training: `train` does the same first, so this only splits a long job in two."""
    from harness.core.target import Target
    from harness.runs.settings import parse_settings
    from harness.train.pipeline import extract_for
    from methods.registry import get_method

    set_threads(threads)
    cls = get_method(method)
    overrides = parse_settings(set_)
    cls.resolve_config(overrides)  # unknown keys fail before the target loads
    tgt = Target.load(target, device, dtype)
    for folder in extract_for(tgt, cls(tgt, overrides), data, prompts, err, shards):
        console.print(folder)


@app.command()
@friendly
def export(
    method: Annotated[str, typer.Argument(help="a learned method (see `cli.py list`)")],
    out: Annotated[Path, typer.Option(help="folder to write the config.json and weight file into")],
    layout: Annotated[str, typer.Option(help="official: the paper's released layout, which its own code loads")] = "official",
    target: TargetOpt = "smollm2-135m",
    checkpoint: CheckpointOpt = None,
    base_model: Annotated[Optional[str], typer.Option(
        help="base model folder named in config.json where the official code reads one (Medusa, Hydra)")] = None,
):
    """Write a drafter (the committed weights, or --checkpoint) in its paper's official layout, one line per
    thing that layout cannot express; the export loads back with --checkpoint OUT."""
    from harness.core.target import Target
    from harness.peers.export import export_drafter

    done = export_drafter(method, Target.load(target, "cpu", "float32"), out, checkpoint, base_model, layout)
    for path in done.files:
        console.print(f"wrote {path}")
    for line in done.departures:
        console.print(f"departure: {line}", soft_wrap=True)


@app.command("calibrate-tree")
@friendly
def calibrate_tree_cmd(
    method: MethodOpt,
    target: TargetOpt = "smollm2-135m",
    checkpoint: Annotated[Optional[Path], typer.Option(
        help="drafter weights to fit the tree to (default: the method's reference weights)")] = None,
    nodes: Annotated[int, typer.Option(help="draft nodes of the tree (verify width = nodes + 1)")] = 15,
    topk: Annotated[int, typer.Option(help="deepest rank a node may take in its head")] = 10,
    data: DistillDataOpt = [],
    prompts: PromptsOpt = Path("../shared/data/train_prompts/prompts.jsonl"),
    shards: ShardsOpt = None,
    save: Annotated[bool, typer.Option(
        "--save", help="make the fitted candidates the checkpoint's default tree (tree=auto: sized per machine "
                       "from its verify cost curve)")] = False,
    fixed: Annotated[bool, typer.Option("--fixed", help="with --save: the --nodes tree itself, on every machine")] = False,
    dtype: DtypeOpt = "auto",
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = 0,
):
    """Fit the static draft tree of a medusa or hydra drafter to its heads on the held-out distilled
    answers (features cached per --dtype; training reports the same search for its configured node
    count). `--save` stores the 63 most frequent nodes with their held-out acceptance as the
    checkpoint's default tree=auto: each run verifies the leading N of them that maximise expected
    tokens per unit of this machine's verify cost; `--save --fixed` stores the --nodes tree."""
    from harness.core.target import Target
    from harness.train.calibrate import calibrate_tree, is_static_tree_drafter, save_tree
    from harness.train.pipeline import load_dataset
    from methods.registry import get_method

    set_threads(threads)
    cls = get_method(method)
    if not is_static_tree_drafter(cls):
        raise SpecbenchError(f"method '{method}' does not draft a static tree: calibrate-tree is for medusa and hydra")
    tgt = Target.load(target, device, dtype)
    folder = checkpoint or cls.find_checkpoint(tgt.name, {})
    drafter = cls.create(tgt, {}, str(folder))
    result = calibrate_tree(drafter, load_dataset(tgt, data, prompts, err, shards).valid, nodes, topk)
    presets = ", ".join(f"{k} {v:.3f}" for k, v in result["expected_tau_presets"].items())
    console.print(f"{method}: {result['nodes']}-node tree fitted on {result['positions']:,} held-out positions "
                  f"({result['conversations']} greedy answers): expected τ {result['expected_tau']:.3f} there, "
                  f"{result['expected_tau_current']:.3f} with the current tree (presets: {presets})")
    console.print(json.dumps(result["tree"]), soft_wrap=True)
    if save:
        save_tree(folder, result, fixed)
        kind = f"the {result['nodes']}-node tree" if fixed else f"{len(result['candidates'])} candidates (tree=auto)"
        console.print(f"saved {kind} as the decoding default of {folder}")


if __name__ == "__main__":
    app()
