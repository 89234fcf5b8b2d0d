"""The data curve: how a learned drafter's held-out top-1 and its τ grow with training tokens.

For each method and train share s it trains round(steps × s) optimiser steps on share s of the
training conversations (equal steps per token: every point makes the same number of passes over
its data; the held-out conversations are the same at every share), then decodes MT-Bench (or the
benchmark given) with those weights in float32 at one tree budget and reads τ. Every step resumes:
a point's training restarts from its last checkpoint, its run folder from its last answer, so a
killed job goes on where it stopped. Pin it to one core:

    taskset -c 0 env OMP_NUM_THREADS=1 python scripts/data_curve.py --methods eagle,eagle3 \\
        --shares 0.25,0.5 --reuse eagle@1=checkpoints/smollm2-135m/eagle --set eagle3.ttt_steps=3

`--reuse method@share=folder` takes a finished checkpoint trained with the same recipe instead of
training that point again (the committed EAGLE weights are the 1× point). A reused share may
exceed 1: weights trained with `cli.py train` on the base folders plus more distilled ones, at
the same steps per token; every point's held-out top-1 is read on the base folders' held-out
split (for such weights by evaluating them once, kept in the checkpoint's held_out.json). The
table, the plot and meta.json (commit, CPU, settings) go to --out.
"""
from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.core.errors import SpecbenchError  # noqa: E402

# The method whose weights a method decodes with, and the method that decodes a point's weights:
# EAGLE-2 is EAGLE's weights under a dynamic tree, so the EAGLE points are read as EAGLE-2.
DECODED_AS = {"eagle": "eagle2"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="eagle,eagle3", help="trainable methods, comma-separated")
    ap.add_argument("--shares", default="0.25,0.5", help="train shares in (0, 1], comma-separated")
    ap.add_argument("--steps", type=int, default=1500, help="optimiser steps at share 1 (scaled by the share)")
    ap.add_argument("--set", action="append", default=[], help="method.key=value for training (architecture keys)")
    ap.add_argument("--reuse", action="append", default=[], help="method@share=checkpoint folder to use as that point")
    add_point_args(ap, "data-curve")
    return ap.parse_args(argv)


def add_point_args(ap: argparse.ArgumentParser, name: str) -> None:
    """The options every trained-and-decoded point shares: the decoding run's settings and where
    checkpoints (checkpoints/experiments/<target>/<name>) and results (results/reference/...) go."""
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--benchmark", default="mt_bench")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--tree-budget", default="24")
    ap.add_argument("--dtype", default="float32", help="dtype of the decoding runs (training uses the features' dtype)")
    ap.add_argument("--checkpoints", type=Path, default=REPO / "checkpoints" / "experiments" / "smollm2-135m" / name)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "reference" / "smollm2-135m" / name)
    ap.add_argument("--data-dir", default=None, help="benchmark prompts (default $SPECBENCH_DATA / ../shared/data)")
    ap.add_argument("--report-only", action="store_true", help="rebuild table and plot from what exists")


def point_name(method: str, share: float) -> str:
    return f"{method}-share{share:g}"


def train_point(target, method: str, share: float, args, console) -> Path:
    """Train (or resume) one point; returns its checkpoint folder."""
    from harness.runs.settings import method_overrides, parse_settings
    from methods.registry import get_method

    overrides = method_overrides(get_method(method), parse_settings(args.set), [method])
    return train_checkpoint(target, method, overrides, share, round(args.steps * share),
                            args.checkpoints / point_name(method, share), console)


def train_checkpoint(target, method: str, overrides: dict, share: float, steps: int, out: Path, console) -> Path:
    """Train `method` with `overrides` for `steps` on share `share` of the training conversations
    into `out`, or resume it there; a folder with its weights and those steps is kept as it is."""
    from harness.train.pipeline import train_method

    done = (out / "config.json").exists() and (out / "model.safetensors").exists()  # a copied config alone is not a point
    if done and json.loads((out / "config.json").read_text()).get("training", {}).get("steps") == steps:
        return out
    train_method(target, method, overrides, steps=steps, out=out, console=console, train_share=share,
                 data=base_data(target.name))
    return out


def base_data(target_name: str) -> list[Path]:
    """The distill folders a share of 1 trains on; every point's held-out top-1 is read on their held-out split."""
    return [REPO / "datasets" / "distill" / target_name, REPO / "datasets" / "distill" / f"{target_name}-followups"]


def decode_point(method: str, share: float, checkpoint: Path, args) -> Path:
    """Run (or resume) the decoding run of one point; returns its run folder."""
    return decode_run(DECODED_AS.get(method, method), checkpoint, args.out / "runs" / point_name(method, share), args)


def decode_run(method: str, checkpoint: Path, folder: Path, args) -> Path:
    """`cli.py run` of `method` with `checkpoint` into `folder` (resumes): args' benchmark, limit,
    tokens, dtype, tree budget, target and data dir."""
    cmd = [sys.executable, str(REPO / "cli.py"), "run", "--method", method,
           "--checkpoint", decode_path(checkpoint), "--benchmark", args.benchmark, "--limit", str(args.limit),
           "--max-new-tokens", str(args.max_new_tokens), "--dtype", args.dtype, "--tree-budget", args.tree_budget,
           "--target", args.target, "--out", str(folder)]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    subprocess.run(cmd, check=True, cwd=REPO)
    return folder


def point_row(method: str, share: float, checkpoint: Path, run: Path, held_out: dict) -> dict[str, object]:
    """One table row: training tokens, steps, held-out top-1 (from `held_out`) and τ of a finished point."""
    import pandas as pd

    training = json.loads((checkpoint / "config.json").read_text()).get("training", {})
    summary = pd.read_csv(run / "summary.csv")
    cell = summary[summary["method"] == DECODED_AS.get(method, method)].iloc[0]
    return {"method": method, "decoded_as": DECODED_AS.get(method, method), "train_share": share,
            "train_tokens": training.get("train_tokens"), "steps": training.get("steps"),
            "held_out_top1": held_out.get("val_acc"), "held_out_top1_step2": held_out.get("val_acc2"),
            "tau": float(cell["tau"]), "answers": int(cell["answers"]),
            "mismatches": int(cell["mismatches"]), "checkpoint": repo_path(checkpoint), "run": repo_path(run)}


def point_held_out(method: str, checkpoint: Path, target_name: str, load_target) -> dict:
    """The point's held-out metrics on the base data's held-out split: its training log's last
    evaluation when it trained on the base folders, else `held_out.json` in the checkpoint,
    made once here by evaluating its weights (`load_target()` gives the target for that)."""
    from harness.core.paths import repo_relative

    base = [repo_relative(f) for f in base_data(target_name)]
    training = json.loads((checkpoint / "config.json").read_text()).get("training", {})
    if [d["folder"] for d in training.get("data", [])] == base:
        return last_evaluation(checkpoint)
    cached = checkpoint / "held_out.json"
    kept = json.loads(cached.read_text()) if cached.exists() else {}
    if kept.get("data") == base:
        return kept["metrics"]
    from harness.core.machine_meta import collect_meta
    from harness.train.pipeline import evaluate_checkpoint

    metrics = evaluate_checkpoint(load_target(), method, checkpoint, base_data(target_name))
    meta = collect_meta()
    cached.write_text(json.dumps({"data": base, "metrics": metrics, "made_by": {
        k: meta.get(k) for k in ("commit", "dirty", "date", "cpu_kind")}}, indent=2) + "\n")
    return metrics


def last_evaluation(checkpoint: Path) -> dict:
    """The last held-out evaluation in a checkpoint's train_log.jsonl ({} if it has none)."""
    evals = [row for row in map(json.loads, (checkpoint / "train_log.jsonl").read_text().splitlines())
             if "val_acc" in row]
    return evals[-1] if evals else {}


def decode_path(path: Path) -> str:
    """A checkpoint as `cli.py run` (run from the repo) finds it: repo-relative inside it, absolute outside."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def repo_path(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console

    from harness.core.target import Target
    from harness.report.data_curve import write_curve

    console = Console(stderr=True)
    shares = [float(s) for s in args.shares.split(",") if s]
    if any(not 0 < s <= 1 for s in shares):
        raise SpecbenchError(f"--shares {args.shares}: every share must be in (0, 1]")
    reuse = {}
    for item in args.reuse:
        point, _, folder = item.partition("=")
        method, _, share = point.partition("@")
        reuse[(method, float(share))] = Path(folder)
    points = sorted({(m, s) for m in args.methods.split(",") if m for s in shares} | set(reuse))
    load_target = functools.cache(lambda: Target.load(args.target, dtype="auto"))  # once, if a point needs it

    rows = []
    for method, share in points:
        ckpt = reuse.get((method, share))
        if ckpt is None:
            ckpt = args.checkpoints / point_name(method, share)
            if not args.report_only:
                ckpt = train_point(load_target(), method, share, args, console)
        run = args.out / "runs" / point_name(method, share)
        if not args.report_only:
            run = decode_point(method, share, ckpt, args)
        if (run / "summary.csv").exists() and (ckpt / "config.json").exists():
            rows.append(point_row(method, share, ckpt, run, point_held_out(method, ckpt, args.target, load_target)))
    write_curve(rows, args.out, {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
    console.print(f"data curve: {len(rows)} points in {args.out}")
    return 0


def run_script(main) -> None:
    """Exit with main()'s code; a SpecbenchError (bad input) is one line and exit code 2; SIGTERM
    stops it like Ctrl-C (a training point saves its resume state), exit code 130, as the CLI."""
    from harness.core.stopping import INTERRUPTED, interrupt_on_stop_signals

    interrupt_on_stop_signals()
    try:
        sys.exit(main())
    except SpecbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"interrupted: {INTERRUPTED}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run_script(main)
