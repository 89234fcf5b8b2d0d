"""τ on the drafters' own distribution: held-out distilled prompts instead of a benchmark.

  python scripts/held_out_tau.py [--methods pld,medusa,hydra,eagle2] [--prompts 20]
      [--max-new-tokens 128] [--dtype float32] [--out results/reference/smollm2-135m/held-out-tau.json]

Takes the first N held-out conversations (the trainer's split: a hash of the opening tokens, so no
drafter ever trained on them) whose distilled answer was greedy, regenerates each answer with every
method at T = 0 and reports τ and mismatches against AR. Set beside the MT-Bench τ it separates
what the drafters learned from how far MT-Bench's answers are from the training mix.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from rich.progress import Progress  # noqa: E402

from harness.core.decode import GenerationConfig, generate  # noqa: E402
from harness.core.machine_meta import collect_meta  # noqa: E402
from harness.core.paths import REPO_ROOT  # noqa: E402
from harness.core.target import Target  # noqa: E402
from harness.train.data import HOLDOUT_SHARE, is_held_out, prompt_key  # noqa: E402
from harness.train.distill import Conversations, load_distilled, read_prompts  # noqa: E402
from methods.registry import get_method  # noqa: E402


def held_out_prompts(target: Target, distill: Path, prompts_file: Path, n: int) -> list[tuple[str, list[int]]]:
    """(prompt id, chat-templated prompt ids) of the first `n` held-out greedy conversations."""
    plan = json.loads((distill / "manifest.json").read_text())["plan"]
    convs = Conversations(target, read_prompts(prompts_file), plan, distill)
    out = []
    for rec in load_distilled(distill):
        if rec["temperature"] != 0.0:
            continue
        messages = convs.messages(rec)
        if is_held_out(prompt_key(messages[0]["content"]), HOLDOUT_SHARE):
            prompt = target.encode_chat(messages)
            out.append((rec["prompt_id"], prompt))
    out.sort(key=lambda p: hashlib.sha256(p[0].encode()).hexdigest())  # a fixed, shard-order-free sample
    return out[:n]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="pld,medusa,hydra,eagle2")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--train-prompts", default="../shared/data/train_prompts/prompts.jsonl")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target = Target.load(args.target, "auto", args.dtype)
    distill = REPO_ROOT / "datasets" / "distill" / target.name
    items = held_out_prompts(target, distill, Path(args.train_prompts), args.prompts)
    methods = args.methods.split(",")
    drafters = {m: get_method(m).create(target, {}) for m in methods}
    cfg = GenerationConfig(args.max_new_tokens)
    rows = {m: {"tokens": 0, "steps": 0, "mismatches": 0, "wall_s": 0.0} for m in ["ar", *methods]}
    with Progress() as progress:
        task = progress.add_task("held-out prompts", total=len(items) * (1 + len(methods)))
        for _, prompt in items:
            ar = generate(target, prompt, cfg)
            rows["ar"]["tokens"] += len(ar.output_ids)
            rows["ar"]["steps"] += len(ar.output_ids)
            rows["ar"]["wall_s"] += ar.wall_s
            progress.advance(task)
            for m, d in drafters.items():
                g = generate(target, prompt, cfg, d)
                rows[m]["tokens"] += sum(g.tokens)
                rows[m]["steps"] += len(g.tokens)
                rows[m]["wall_s"] += g.wall_s
                rows[m]["mismatches"] += g.output_ids != ar.output_ids
                progress.advance(task)
    table = {m: {"tau": round(r["tokens"] / max(1, r["steps"]), 3), "mismatches": r["mismatches"],
                 "answers": len(items), "wall_s": round(r["wall_s"], 1)} for m, r in rows.items()}
    for m, r in table.items():
        print(f"{m:8s} τ {r['tau']:.3f}  mismatches {r['mismatches']}/{r['answers']}")
    record = {"table": table, "prompt_ids": [p for p, _ in items], "distill_shards": len(list(distill.glob("shard-*.jsonl"))),
              "config": vars(args), "checkpoints": {m: d.checkpoint_hash() for m, d in drafters.items()},
              "provenance": collect_meta()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
