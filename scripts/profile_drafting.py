"""Where a drafter's milliseconds go (issue 17): draft ms per step against the AR step of the same
run, split into the drafter's parts, and the torch ops behind them.

  python scripts/profile_drafting.py --data-dir ../shared/data [--methods eagle2,gumiho]
      [--prompts 3] [--max-new-tokens 64] [--dtype bfloat16] [--ops 15] [--out profile.json]
      [--both-layer-paths] [--both-packings] [--compile]

For each method: one warm-up answer, then the first-turn prompts of MT-Bench answered by AR and by
the method, alternating, each timed by the loop's own clock (draft = propose + observe). The
drafter's parts are timed by wrapping its own functions (inclusive ms per step; "rest" is the
propose/observe time spent outside them: Python bookkeeping of the tree). Then one more answer runs
under torch.profiler: the ops with the most self CPU time, and how many ops a step launches, which
is what says overhead (many small ops) rather than arithmetic.
Run it alone on the cores; it prints the CPU kind and thread count it measured with.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.core.cost_model import CURVE_SIZES  # noqa: E402
from harness.core.decode import GenerationConfig, generate  # noqa: E402
from harness.core.draft_layers import DecoderStack  # noqa: E402
from harness.core.allocator import keep_freed_memory  # noqa: E402
from harness.core.machine_meta import collect_meta  # noqa: E402
from harness.core.packed_linear import set_packing  # noqa: E402
from harness.core.target import Target  # noqa: E402
from harness.runs.benchmarks import load_questions  # noqa: E402
from harness.runs.settings import method_overrides, parse_settings  # noqa: E402
from methods.registry import get_method  # noqa: E402

# (label, owner path from the drafter, attribute): the drafter functions timed as parts. Missing
# ones are skipped, so one list serves every method.
PARTS = [
    ("draft layers", "", "draft_forward"),
    ("prefix layer", "", "_prefix_step"),
    ("MLP heads", "", "run_mlp"),
    ("head hidden", "", "head_hidden"),
    ("LM head + top-k", "vocab", "draft_topk"),
    ("LM head logits", "vocab", "draft_logits"),
    ("tree mask", "", "tree_mask"),
]
TOP = ("propose", "observe")


class Clock:
    """Inclusive seconds and calls per wrapped function; nested parts are kept apart by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._wrapped: list[tuple[object, str]] = []

    def wrap(self, owner, attr: str, label: str) -> None:
        """Time `owner.attr` under `label` (an instance attribute shadowing the method)."""
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(owner, attr, timed)
        self._wrapped.append((owner, attr))

    def unwrap(self) -> None:
        """Put the wrapped methods back."""
        for owner, attr in reversed(self._wrapped):
            delattr(owner, attr)
        self._wrapped.clear()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(drafter, clock: Clock) -> list[str]:
    """Wrap the drafter's parts with `clock` (undone by `clock.unwrap()`)."""
    labels = []
    for label, path, attr in PARTS:
        owner = drafter if not path else getattr(drafter, path, None)
        if owner is not None and callable(getattr(owner, attr, None)):
            clock.wrap(owner, attr, label)
            labels.append(label)
    for attr in TOP:
        clock.wrap(drafter, attr, attr)
    return labels


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--methods", default="eagle2,gumiho,eagle,hydra,medusa")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--ops", type=int, default=15, help="rows of the op table (0: no torch.profiler pass)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE or METHOD.KEY=VALUE, as the CLI's --set")
    ap.add_argument("--both-layer-paths", action="store_true",
                    help="measure drafters with attention layers twice: transformers' layers, then the fast decode path")
    ap.add_argument("--both-packings", action="store_true",
                    help="measure every method twice: weights unpacked (plain F.linear), then packed for oneDNN")
    ap.add_argument("--compile", action="store_true",
                    help="the target on the compiled runtime (AR and verify); each method is then measured "
                         "twice, its draft layers eager and compiled")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    keep_freed_memory()  # the CLI's heap settings, so figures compare with a run's

    target = Target.load(args.target, "cpu", args.dtype)
    if args.compile:
        target.enable_compile()
        target.runtime.warm_up_to(max(CURVE_SIZES))  # every tree size a method may verify
    meta = collect_meta()
    print(f"{meta['cpu_kind']}, {torch.get_num_threads()} threads, {args.target} {args.dtype}, "
          f"commit {meta['commit'][:7]}{' (dirty)' if meta['dirty'] else ''}")
    prompts = [target.encode_chat([{"role": "user", "content": q.turns[0]}])
               for q in load_questions("mt_bench", args.data_dir, limit=args.prompts)]
    cfg = GenerationConfig(args.max_new_tokens)
    settings = parse_settings(args.set)
    generate(target, prompts[0], GenerationConfig(16))  # warm-up of the target alone

    report = {"meta": meta, "args": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out")},
              "methods": {}}
    ar_ops = 0.0
    if args.ops:  # aten ops of an AR step, for the ops-per-step figure of every method
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof_ar:
            a = generate(target, prompts[0], cfg)
        ar_ops = sum(e.count for e in prof_ar.key_averages() if e.key.startswith("aten::")) / len(a.verify_ms)
    runs = []
    for name in args.methods.split(","):
        cls = get_method(name)
        drafter = cls.create(target, method_overrides(cls, settings, []))
        stacks = [m for m in drafter.modules() if isinstance(m, DecoderStack)]
        if args.both_layer_paths and stacks:
            runs.append((f"{name} (transformers layers)", drafter, stacks, False, True, False))
        if args.both_packings:
            runs.append((f"{name} (unpacked weights)", drafter, stacks, True, False, False))
        runs.append((name, drafter, stacks, True, True, False))
        if args.compile and (stacks or name == "sps"):
            runs.append((f"{name} (draft layers compiled)", drafter, stacks, True, True, True))
    for name, drafter, stacks, fast, packing, compiled in runs:
        for stack in stacks:
            stack.fast_decode = fast and stack.fast_decode_supported
        set_packing(packing)
        clock = Clock()
        labels = instrument(drafter, clock)
        if compiled:
            drafter.enable_compile()
        generate(target, prompts[0], GenerationConfig(16), drafter)  # warm-up
        for runtime in drafter.runtimes():
            runtime.warm_up_seen()
        clock.reset()
        ar_steps, ar_ms, steps, draft_ms, verify_ms, tokens = 0, 0.0, 0, 0.0, 0.0, 0
        for p in prompts:
            ar = generate(target, p, cfg)
            ar_steps += len(ar.verify_ms)
            ar_ms += sum(ar.verify_ms) + sum(ar.draft_ms)
            g = generate(target, p, cfg, drafter)
            steps += len(g.draft_ms)
            draft_ms += sum(g.draft_ms)
            verify_ms += sum(g.verify_ms)
            tokens += sum(g.tokens)
        ar_step = ar_ms / ar_steps
        parts = {lab: 1e3 * clock.seconds[lab] / steps for lab in labels if clock.calls[lab]}
        calls = {lab: clock.calls[lab] / steps for lab in labels if clock.calls[lab]}
        top = 1e3 * (clock.seconds["propose"] + clock.seconds["observe"]) / steps
        parts["rest (Python, tree bookkeeping)"] = top - sum(parts.values())
        row = {"steps": steps, "tau": tokens / steps, "ar_step_ms": ar_step, "draft_ms": draft_ms / steps,
               "verify_ms": verify_ms / steps, "draft_over_ar_step": draft_ms / steps / ar_step,
               "verify_over_ar_step": verify_ms / steps / ar_step, "parts_ms": parts, "calls_per_step": calls}
        print(f"\n{name}: τ {row['tau']:.2f}; per step draft {row['draft_ms']:.2f} ms = "
              f"{row['draft_over_ar_step']:.2f} AR step ({ar_step:.1f} ms), verify {row['verify_ms']:.1f} ms = "
              f"{row['verify_over_ar_step']:.2f} AR step")
        for lab, ms in parts.items():
            extra = f"  ({calls[lab]:.1f} calls)" if lab in calls else ""
            print(f"  {lab:34s} {ms:7.2f} ms{extra}")
        if args.ops:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                g = generate(target, prompts[0], cfg, drafter)
            n_steps = len(g.draft_ms)
            events = prof.key_averages()
            ops = sorted((e for e in events if e.key.startswith("aten::")), key=lambda e: -e.self_cpu_time_total)
            # ops launched per step (drafting and verifying together; AR's own count beside it)
            all_ops = sum(e.count for e in events if e.key.startswith("aten::")) / n_steps
            row["aten_ops_per_step"] = all_ops
            row["ar_aten_ops_per_step"] = ar_ops
            row["top_ops"] = [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / n_steps,
                               "calls_per_step": e.count / n_steps} for e in ops[: args.ops]]
            print(f"  aten ops per step: {all_ops:.0f} (AR: {ar_ops:.0f}); top self CPU time per step:")
            for o in row["top_ops"]:
                print(f"    {o['op']:40s} {o['self_ms_per_step']:7.2f} ms  {o['calls_per_step']:6.1f} calls")
        report["methods"][name] = row
        clock.unwrap()
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    med = statistics.median(r["ar_step_ms"] for r in report["methods"].values())
    print(f"\nAR step (median over the methods' runs): {med:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
