"""specbench command line: `python cli.py COMMAND --help` (or the `specbench` console script)."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from harness.errors import SpecbenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark speculative decoders on one common code path.")
console = Console()
err = Console(stderr=True)

DATA_HELP = "folder with <benchmark>/question.jsonl (default: $SPECBENCH_DATA)"


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
            err.print("[yellow]interrupted:[/] finished answers are saved; rerun the same command to resume")
            raise typer.Exit(130)
    return wrapper


def split_csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@app.command()
@friendly
def run(
    method: str = typer.Option(..., "--method", "-m", help="method(s), comma-separated; AR always runs beside them"),
    benchmark: str = typer.Option("mt_bench", "--benchmark", "-b", help="benchmark(s), comma-separated"),
    target: str = typer.Option("smollm2-135m", help="alias, HF dir, .gguf file or hub id"),
    dtype: str = typer.Option("auto", help="auto | float32 | bfloat16 | float16"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    limit: Optional[int] = typer.Option(None, help="N questions spread evenly over categories"),
    ids: Optional[str] = typer.Option(None, help="explicit question ids, comma-separated"),
    max_new_tokens: int = typer.Option(128, help="new tokens per answer (per turn)"),
    temperature: float = typer.Option(0.0),
    top_p: float = typer.Option(1.0),
    acceptance: Optional[str] = typer.Option(None, help="greedy | lossless | typical (default: greedy at T=0, lossless at T>0)"),
    seed: int = typer.Option(0),
    checkpoint: Optional[str] = typer.Option(None, help="drafter weights: folder or hub id"),
    set_: list[str] = typer.Option([], "--set", help="method config key=value (JSON values; method.key=value for one method)"),
    chat_template: Optional[str] = typer.Option(None, help="'vicuna' or a Jinja template, for targets without one"),
    system_prompt: Optional[str] = typer.Option(None),
    data_dir: Optional[Path] = typer.Option(None, help=DATA_HELP),
    out: Optional[Path] = typer.Option(None, help="run folder (default results/runs/<config hash>)"),
):
    """Run methods and AR on the same prompts; write records.jsonl, meta.json and summary.csv. Resumes."""
    from harness.runner import RunConfig, Runner, parse_settings

    cfg = RunConfig(
        methods=split_csv(method), benchmarks=split_csv(benchmark), target=target, dtype=dtype, device=device,
        limit=limit, ids=[int(i) for i in split_csv(ids)] if ids else None, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, acceptance=acceptance, seed=seed, checkpoint=checkpoint,
        settings=parse_settings(set_), chat_template=chat_template, system_prompt=system_prompt,
    )
    runner = Runner(cfg, out, data_dir, err)
    path = runner.run()
    df = runner.write_summary()
    print_summary(df)
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
    console.print(table)


@app.command()
@friendly
def summary(run_dir: Path = typer.Argument(..., help="a run folder")):
    """Rebuild summary.csv of a run folder from its records.jsonl."""
    from harness.runner import summarize_dir

    print_summary(summarize_dir(run_dir))


@app.command("list")
@friendly
def list_():
    """Methods, benchmarks and target aliases."""
    from harness.benchmarks import BENCHMARKS
    from harness.target import ALIASES
    from methods.registry import get_method, method_names

    console.print("[bold]methods[/]: ar (plain decoding, always run as the baseline)")
    for name in method_names():
        cls = get_method(name)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        console.print(f"  {name}: {doc}")
    console.print("[bold]benchmarks[/]: " + ", ".join(BENCHMARKS))
    console.print("[bold]target aliases[/]: " + ", ".join(ALIASES))


@app.command("fetch-data")
@friendly
def fetch_data(dest: Path = typer.Argument(..., help="folder to write <benchmark>/question.jsonl into"),
               force: bool = typer.Option(False, help="download even when a verified copy is present")):
    """Download the six EAGLE-format question files and check their SHA-256."""
    from urllib.request import urlopen

    from harness.benchmarks import fetch_data as fetch

    paths = fetch(dest, opener=lambda url: urlopen(url, timeout=60), force=force)
    for p in paths:
        console.print(f"ok {p}")


@app.command()
@friendly
def bench(
    target: str = typer.Option("smollm2-135m"),
    dtype: str = typer.Option("auto"),
    device: str = typer.Option("auto"),
    contexts: str = typer.Option("256,1536", help="context lengths for the cost curve"),
    sizes: str = typer.Option("1,2,4,8,16,32,64", help="tree tokens per forward"),
    repeats: int = typer.Option(7),
    ar_prompts: int = typer.Option(3, help="MT-Bench prompts for AR vs HF generate (0 = skip)"),
    max_new_tokens: int = typer.Option(64),
    pld: bool = typer.Option(False, "--pld", help="also: our pld vs HF prompt lookup per benchmark"),
    pld_benchmarks: str = typer.Option("mt_bench,humaneval,gsm8k,cnn_dm"),
    pld_prompts: int = typer.Option(3),
    data_dir: Optional[Path] = typer.Option(None, help=DATA_HELP),
    out: Optional[Path] = typer.Option(None, help="write the results as JSON here"),
):
    """Cost curve of a k-token forward, our AR loop vs HF generate, and (--pld) pld vs HF prompt lookup."""
    from harness.bench import run_bench

    run_bench(target=target, dtype=dtype, device=device, contexts=[int(c) for c in split_csv(contexts)],
              sizes=[int(s) for s in split_csv(sizes)], repeats=repeats, ar_prompts=ar_prompts,
              max_new_tokens=max_new_tokens, pld=pld, pld_benchmarks=split_csv(pld_benchmarks),
              pld_prompts=pld_prompts, data_dir=data_dir, out=out, console=console)


@app.command()
@friendly
def distill(
    target: str = typer.Option("smollm2-135m"),
    prompts: Path = typer.Option(..., help="training prompts jsonl ({id, category, prompt}); never a benchmark file"),
    n: Optional[int] = typer.Option(None, help="cap on prompts after the mix"),
    samples: int = typer.Option(2, help="responses per prompt: 1 greedy + samples-1 sampled"),
    max_new_tokens: int = typer.Option(384),
    batch_size: int = typer.Option(32),
    shard_size: int = typer.Option(96),
    max_shards: Optional[int] = typer.Option(None, help="stop after this many new shards (spread work over runs)"),
    dtype: str = typer.Option("auto"),
    device: str = typer.Option("auto"),
    out: Optional[Path] = typer.Option(None, help="default datasets/distill/<target>"),
):
    """Have the target answer training prompts; commit-ready token ids, resumable shard by shard."""
    from rich.progress import Progress

    from harness.target import Target
    from harness.train.distill import DistillPlan, distill as run_distill

    plan = DistillPlan(str(prompts), n=n, samples=samples, max_new_tokens=max_new_tokens, shard_size=shard_size)
    tgt = Target.load(target, device, dtype)
    out = out or Path(__file__).resolve().parent / "datasets" / "distill" / target
    with Progress(console=err) as progress:
        res = run_distill(tgt, prompts, out, plan, batch_size=batch_size, max_shards=max_shards, progress=progress)
    console.print(res)


if __name__ == "__main__":
    app()
