"""Which of EAGLE-3's parts pays on this target: feature fusion, the training-time test, the
pruned draft vocabulary.

Each variant is EAGLE-3's recipe with one part taken away, trained on the same share of the
training conversations for the same optimiser steps; beside them the recipe itself and EAGLE's
draft head (decoded as EAGLE-2, with its 8,192-id head or all ids) at the same data. Every point
then decodes float32 MT-Bench ×10 (128 tokens, greedy) at one tree budget. The table gives
held-out top-1, τ with its 95% bootstrap interval and the share of verify steps accepting ≥ 1, 2,
3 drafts. Every step resumes (training
from its last checkpoint, decoding from its last answer). Pin it to one core:

    taskset -c 0 env OMP_NUM_THREADS=1 python scripts/eagle3_parts.py \\
        --reuse eagle3=checkpoints/smollm2-135m/eagle3

`--reuse variant=folder` takes a finished checkpoint trained with the same recipe instead of
training it again (the committed EAGLE-3 weights are the recipe at share 1/4).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.core.errors import unknown  # noqa: E402
from scripts.data_curve import add_point_args, decode_run, last_evaluation, repo_path, run_script, train_checkpoint  # noqa: E402

RECIPE = {"ttt_steps": 3}  # the committed EAGLE-3 weights' recipe (the paper's 7 costs 2.6x per step here)
# variant -> (method trained, its overrides on top of the recipe, method decoding it, what differs)
VARIANTS: dict[str, tuple[str, dict, str, str]] = {
    "eagle3": ("eagle3", {}, "eagle3", "the recipe: layers 2, L//2, L-3 fused; training-time test of 3 steps; "
                                       "8,192-id draft vocabulary"),
    "no-fusion": ("eagle3", {"fuse_layers": "high"}, "eagle3", "fc reads layer L-3's input alone"),
    "no-ttt": ("eagle3", {"ttt_steps": 1}, "eagle3", "trained on the target's features only (1 step)"),
    "full-vocab": ("eagle3", {"draft_vocab": 0}, "eagle3", "its head covers all 49,152 ids (no d2t/t2d)"),
    "vocab-16k": ("eagle3", {"draft_vocab": 16384}, "eagle3", "a 16,384-id draft vocabulary (twice the recipe's)"),
    "eagle2": ("eagle", {}, "eagle2", "EAGLE's draft head (last-layer feature, feature regression, "
                                      "8,192-id head) under EAGLE-2's tree"),
    "eagle2-full-vocab": ("eagle", {"draft_vocab": 0}, "eagle2", "EAGLE-2 whose head covers all 49,152 ids "
                                                                 "(no draft_ids): the vocabulary part on EAGLE-2"),
}
DEPTHS = 3


def training_config(name: str) -> dict:
    """The config keys variant `name` trains with: EAGLE-3's recipe (EAGLE-3 variants only) and
    the variant's overrides on top."""
    method, overrides, _, _ = VARIANTS[name]
    return {**(RECIPE if method == "eagle3" else {}), **overrides}


def draft_vocab_ids(checkpoint: Path) -> set[int] | None:
    """The target ids a checkpoint's head can propose (EAGLE's `draft_ids`, EAGLE-3's d2t); None:
    the whole vocabulary."""
    import torch
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        if "draft_ids" in f.keys():
            return set(f.get_tensor("draft_ids").tolist())
        if "d2t" in f.keys():
            d2t = f.get_tensor("d2t")
            return set((d2t + torch.arange(d2t.numel())).tolist())
    return None


def steps_blocked_by_vocab(records, vocab: set[int] | None) -> float:
    """Share of verify steps whose bonus token (the target's token where the drafts stopped
    matching) lies outside the draft vocabulary: no draft could have matched it there. That is the
    most a full vocabulary could add: one more accepted token on each of those steps, and more
    behind it only where the deeper drafts also match."""
    if vocab is None:
        return 0.0
    blocked = total = 0
    for r in records:
        pos = 1 if r.first_token_from_prefill else 0
        for accepted, tokens in zip(r.steps.accepted or [], r.steps.tokens or []):
            pos += tokens
            if tokens == accepted + 1:  # not cut at the token limit: the last token is the bonus
                total += 1
                blocked += r.output_ids[pos - 1] not in vocab
    return blocked / total if total else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="eagle3,no-fusion,no-ttt,full-vocab,eagle2", help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--share", type=float, default=0.25, help="share of the training conversations")
    ap.add_argument("--steps", type=int, default=375, help="optimiser steps of every variant")
    ap.add_argument("--reuse", action="append", default=[], help="variant=checkpoint folder to use as that variant")
    add_point_args(ap, "ablations/eagle3-parts")
    return ap.parse_args(argv)


def variant_row(name: str, checkpoint: Path, run: Path) -> dict[str, object]:
    """One table row: parameters, training, held-out top-1, τ and its interval, depth acceptance."""
    from harness.runs.metrics import TAU, attach_divergences, depth_acceptance, interval
    from harness.runs.results import RunDir

    method, _, decoded, differs = VARIANTS[name]
    config = json.loads((checkpoint / "config.json").read_text())
    answers = [r for r in attach_divergences(RunDir(run).read_records()) if r.method == decoded]
    rows = TAU.rows(answers)
    lo, hi = interval(TAU.replicates(rows, ("eagle3-parts", name)))
    return {"variant": name, "method": method, "decoded_as": decoded, "differs": differs,
            "arch": json.dumps(config.get("arch", {}), sort_keys=True), "parameters": config.get("parameters"),
            "train_tokens": config.get("training", {}).get("train_tokens"),
            "steps": config.get("training", {}).get("steps"),
            "held_out_top1": last_evaluation(checkpoint).get("val_acc"),
            "tau": float(TAU.estimate(rows)), "tau_lo": lo, "tau_hi": hi,
            **{f"depth{d}": depth_acceptance(d).of(answers) for d in range(1, DEPTHS + 1)},
            "blocked_by_vocab": steps_blocked_by_vocab(answers, draft_vocab_ids(checkpoint)),
            "answers": len(answers), "mismatches": sum(bool(r.divergence) for r in answers),
            "checkpoint": repo_path(checkpoint), "run": repo_path(run)}


def parts_markdown(rows: list[dict[str, object]], settings: dict[str, object]) -> str:
    """The table, τ against the recipe's, with a caption that says what was measured."""
    base = next((r["tau"] for r in rows if r["variant"] == "eagle3"), None)
    lines = [f"EAGLE-3 with one part taken away, each trained {settings['steps']} steps on share "
             f"{settings['share']:g} of the training conversations; τ ({settings['benchmark']} ×{settings['limit']}, "
             f"{settings['max_new_tokens']} tokens, {settings['dtype']}, greedy, tree budget {settings['tree_budget']}) "
             f"with its 95% bootstrap interval over answers; depth d: share of verify steps accepting ≥ d drafts.", "",
             "Blocked: share of verify steps whose bonus token lies outside the draft vocabulary (no draft "
             "could match it; the most a full vocabulary could win back is about one token on each).", "",
             "| variant | what differs | parameters | held-out top-1 | τ [95% CI] | Δτ | depth 1 | depth 2 | "
             "depth 3 | blocked | answers (≠ AR) |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        delta = "" if base is None or r["variant"] == "eagle3" else f"{r['tau'] - base:+.2f}"
        lines.append(f"| {r['variant']} | {r['differs']} | {int(r['parameters']):,} | {r['held_out_top1']:.3f} | "
                     f"{r['tau']:.2f} [{r['tau_lo']:.2f}, {r['tau_hi']:.2f}] | {delta} | {r['depth1']:.3f} | "
                     f"{r['depth2']:.3f} | {r['depth3']:.3f} | {r['blocked_by_vocab']:.3f} | {r['answers']} ({r['mismatches']}) |")
    return "\n".join(lines) + "\n"


def write_parts(rows: list[dict[str, object]], out: Path, settings: dict[str, object]) -> None:
    """parts.csv, parts.md and meta.json (settings, commit, machine) in `out`."""
    import pandas as pd

    from harness.core.machine_meta import collect_meta

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "parts.csv", index=False, float_format="%.4f")
    (out / "parts.md").write_text(parts_markdown(rows, settings))
    meta = {"settings": {k: v for k, v in settings.items() if k not in ("checkpoints", "out", "data_dir")},
            "recipe": RECIPE, "variants": {k: VARIANTS[k][:2] for k in settings["variants"].split(",")},
            "machine": collect_meta()}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console

    from harness.core.target import Target

    console = Console(stderr=True)
    names = [v for v in args.variants.split(",") if v]
    for name in names:
        if name not in VARIANTS:
            raise unknown("variant", name, list(VARIANTS))
    reuse = dict(item.partition("=")[::2] for item in args.reuse)
    target, rows = None, []
    for name in names:
        method, _, decoded, _ = VARIANTS[name]
        ckpt = Path(reuse[name]) if name in reuse else args.checkpoints / name
        if name not in reuse and not args.report_only:
            target = target or Target.load(args.target, dtype="auto")
            train_checkpoint(target, method, training_config(name), args.share, args.steps, ckpt, console)
        run = args.out / "runs" / name
        if not args.report_only:
            decode_run(decoded, ckpt, run, args)
        if (run / "records.jsonl").exists() and (ckpt / "config.json").exists():
            rows.append(variant_row(name, ckpt, run))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    write_parts(rows, args.out, settings)
    console.print(f"EAGLE-3 parts: {len(rows)} variants in {args.out}")
    return 0


if __name__ == "__main__":
    run_script(main)
