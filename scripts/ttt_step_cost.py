"""Seconds per EAGLE-3 training step as a function of `ttt_steps` (the training-time test's unrolled
steps), on the shared trainer and the same batches, beside one EAGLE step for scale.

Each setting trains a fresh drafter for --steps optimiser steps through harness.train.trainer
(the first --skip steps are dropped as warm-up); the settings run in the order given and then in
reverse, so a drift in the machine's load falls on all of them alike. Prints one JSON object.

  taskset -c 1 python scripts/ttt_step_cost.py --ttt 1,3,7 --steps 5 --shards 1 --threads 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402


def step_seconds(drafter, dataset, steps: int, tokens_per_batch: int, max_len: int) -> list[float]:
    """Seconds of each optimiser step of `drafter` on the dataset's first batches (shared trainer)."""
    from harness.train.trainer import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(steps=steps, tokens_per_batch=tokens_per_batch, max_len=max_len, save_every=10**9,
                          eval_every=10**9, eval_batches=0)
        Trainer(drafter, dataset, cfg, Path(out), Console(file=open("/dev/null", "w"))).train()
        rows = [json.loads(line) for line in (Path(out) / "train_log.jsonl").read_text().splitlines()]
    cum = [0.0] + [r["seconds"] for r in rows]
    return [b - a for a, b in zip(cum, cum[1:])]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto", help="the target's dtype (features are extracted in it)")
    ap.add_argument("--ttt", default="1,3,7", help="ttt_steps values to time")
    ap.add_argument("--steps", type=int, default=5, help="optimiser steps per setting and pass")
    ap.add_argument("--skip", type=int, default=1, help="first steps of each run not counted (warm-up)")
    ap.add_argument("--shards", type=int, default=1, help="distill shards to load (one is ~100 answers)")
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-eagle", action="store_true", help="skip the EAGLE step for scale")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from harness.core.machine_meta import OtherCpuUse, collect_meta
    from harness.core.target import Target
    from harness.train.data import frequent_answer_tokens
    from harness.train.pipeline import load_dataset
    from methods.registry import get_method

    Eagle, Eagle3 = get_method("eagle"), get_method("eagle3")

    target = Target.load(args.target, "cpu", args.dtype)
    layers = Eagle3(target).target_layers()
    data = load_dataset(target, shards=args.shards, layers=layers)
    vocab = frequent_answer_tokens(data.train, Eagle3.defaults["draft_vocab"], target.vocab_size)

    def build(setting: str):
        torch.manual_seed(0)
        d = Eagle(target) if setting == "eagle" else Eagle3(target, {"ttt_steps": int(setting)})
        d.set_draft_vocab(vocab)
        return d

    settings = args.ttt.split(",") + ([] if args.no_eagle else ["eagle"])
    times: dict[str, list[float]] = {s: [] for s in settings}
    with OtherCpuUse() as others:  # how busy the rest of the machine was meanwhile
        for setting in settings + settings[::-1]:
            times[setting] += step_seconds(build(setting), data, args.steps, args.tokens_per_batch,
                                           args.max_len)[args.skip :]
    meta = collect_meta()
    base = statistics.median(times[settings[0]])
    out = {"target": args.target, "dtype": str(target.dtype).replace("torch.", ""), "threads": args.threads,
           "tokens_per_batch": args.tokens_per_batch, "steps_counted": {s: len(v) for s, v in times.items()},
           "median_s": {s: round(statistics.median(v), 3) for s, v in times.items()},
           "min_s": {s: round(min(v), 3) for s, v in times.items()},
           f"ratio_to_{settings[0]}": {s: round(statistics.median(v) / base, 2) for s, v in times.items()},
           "cpu": meta.get("cpu_model"), "other_cpu_cores": None if others.cores is None else round(others.cores, 2),
           "commit": meta.get("commit"), "dirty": meta.get("dirty")}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
