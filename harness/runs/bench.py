"""`cli.py bench`: the machine's cost curve and head-to-head checks against transformers.

1. Cost curve: time of one cached forward of k tree tokens at given context lengths, as ratios to
   k = 1 (what a tree budget costs here: the input for choosing tree sizes and pld's chain length).
2. Our AR loop vs HF `generate` (greedy), same prompts, dtype and threads, both warmed up.
3. (--pld) our `pld` vs HF prompt lookup (`generate(prompt_lookup_num_tokens=10)`), each against
   its own stack's plain decoding, with tau for both (HF's counted through a streamer).
All timings are medians of interleaved repeats, so drift hits every contender alike.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from harness.core.decode import GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.core.tree import DraftTree
from harness.runs.benchmarks import load_questions, resolve_data_dir
from harness.runs.results import collect_meta, load_average_warning


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def cost_curve(target: Target, contexts: list[int], sizes: list[int], repeats: int) -> dict[int, dict[int, float]]:
    """{context: {k: ms}} for one forward of k chain-tree tokens on top of `context` cached tokens."""
    g = torch.Generator().manual_seed(0)
    out: dict[int, dict[int, float]] = {}
    for ctx in contexts:
        prefix = torch.randint(0, target.vocab_size, (ctx,), generator=g)
        cache = target.new_cache(capacity=ctx + max(sizes) + 8)
        target.forward(prefix, cache, logits="none")
        out[ctx] = {}
        for k in sizes:
            tree = DraftTree.chain(1, torch.randint(0, target.vocab_size, (k - 1,), generator=g))

            def step() -> None:
                if k == 1:
                    target.forward(tree.tokens, cache)
                else:
                    target.forward(tree.tokens, cache, position_ids=ctx + tree.depths, tree_mask=tree.attention_mask)
                cache.crop_to(ctx)

            step()  # warm-up of this shape
            out[ctx][k] = _median_ms(step, repeats)
    return out


class _StepCounter:
    """A transformers streamer that counts generation steps: put() is called once with the prompt,
    then once per forward with the tokens that forward added."""

    def __init__(self) -> None:
        self.puts: list[int] = []

    def put(self, value) -> None:
        self.puts.append(int(value.numel()))

    def end(self) -> None:
        pass

    def tau(self) -> float:
        steps = self.puts[1:]
        return sum(steps) / max(1, len(steps))


def _hf_generate(target: Target, ids: list[int], max_new: int, **kw) -> tuple[list[int], float, float]:
    counter = _StepCounter()
    inp = torch.tensor([ids], device=target.device)
    t0 = time.perf_counter()
    out = target.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new,
                                do_sample=False, streamer=counter, pad_token_id=next(iter(target.eos_token_ids), 0),
                                eos_token_id=sorted(target.eos_token_ids) or None, **kw)
    dt = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), dt, counter.tau()


def _ours(target: Target, ids: list[int], max_new: int, drafter=None) -> tuple[list[int], float, float]:
    g = generate(target, ids, GenerationConfig(max_new), drafter)
    return g.output_ids, g.wall_s, g.tau


def _contest(target: Target, prompts: list[list[int]], max_new: int, contenders: dict[str, Any],
             repeats: int) -> dict[str, dict[str, float]]:
    """Interleaved repeats: every round runs each contender once on every prompt; tok/s per round,
    median over rounds. Returns {name: {"tok_s", "tau", "tokens"}} and keeps the outputs."""
    for fn in contenders.values():  # warm-up
        fn(prompts[0], min(16, max_new))
    rounds: dict[str, list[float]] = {n: [] for n in contenders}
    taus: dict[str, list[float]] = {n: [] for n in contenders}
    outputs: dict[str, list[list[int]]] = {n: [] for n in contenders}
    for r in range(repeats):
        names = list(contenders)
        names = names[r % len(names):] + names[: r % len(names)]
        for name in names:
            tokens, secs = 0, 0.0
            for i, p in enumerate(prompts):
                out, dt, tau = contenders[name](p, max_new)
                tokens += len(out)
                secs += dt
                if r == 0:
                    outputs[name].append(out)
                    taus[name].append(tau)
            rounds[name].append(tokens / secs)
    return {n: {"tok_s": statistics.median(rounds[n]), "tau": statistics.mean(taus[n]),
                "outputs": outputs[n]} for n in contenders}


def run_bench(*, target: str, dtype: str, device: str, contexts: list[int], sizes: list[int], repeats: int,
              ar_prompts: int, max_new_tokens: int, pld: bool, pld_benchmarks: list[str], pld_prompts: int,
              data_dir: Path | None, out: Path | None, console: Console) -> dict[str, Any]:
    warn = load_average_warning()
    if warn:
        console.print(f"[yellow]warning:[/] {warn} — timings will be noisy")
    if 1 not in sizes:
        raise SpecbenchError("--sizes must include 1 (the ratios are taken against a 1-token step)")
    with console.status(f"loading {target}"):
        tgt = Target.load(target, device, dtype)
    dt_name = str(tgt.dtype).replace("torch.", "")
    meta = collect_meta()
    result: dict[str, Any] = {"target": target, "dtype": dt_name, "threads": torch.get_num_threads(),
                              "cpu_kind": meta["cpu_kind"] if tgt.device.type == "cpu" else meta["gpu"], "meta": meta}

    with console.status("cost curve"):
        curve = cost_curve(tgt, contexts, sizes, repeats)
    result["cost_curve_ms"] = curve
    table = Table(title=f"one forward of k tree tokens, {target} {dt_name}, {result['cpu_kind']}, "
                        f"{result['threads']} threads: ms (ratio to k=1)")
    table.add_column("context")
    for k in sizes:
        table.add_column(f"k={k}")
    for ctx, row in curve.items():
        table.add_row(str(ctx), *[f"{row[k]:.1f} ({row[k] / row[1]:.2f}x)" for k in sizes])
    console.print(table)

    if ar_prompts or pld:
        data = resolve_data_dir(data_dir)
    if ar_prompts:
        qs = load_questions("mt_bench", data, limit=ar_prompts)
        prompts = [tgt.encode_chat([{"role": "user", "content": q.turns[0]}]) for q in qs]
        with console.status("AR loop vs HF generate"):
            res = _contest(tgt, prompts, max_new_tokens, {
                "ours": lambda p, n: _ours(tgt, p, n),
                "hf": lambda p, n: _hf_generate(tgt, p, n),
            }, repeats=max(3, repeats // 2))
        same = res["ours"]["outputs"] == res["hf"]["outputs"]
        ratio = res["ours"]["tok_s"] / res["hf"]["tok_s"]
        result["ar_vs_hf"] = {"ours_tok_s": res["ours"]["tok_s"], "hf_tok_s": res["hf"]["tok_s"],
                              "ratio": ratio, "identical_outputs": same, "prompts": len(prompts),
                              "max_new_tokens": max_new_tokens}
        console.print(f"AR loop: ours {res['ours']['tok_s']:.2f} tok/s, HF generate {res['hf']['tok_s']:.2f} tok/s "
                      f"-> {ratio:.3f}x; identical outputs: {same}")

    if pld:
        from methods.pld import PromptLookupDrafter

        drafter = PromptLookupDrafter(tgt)
        t = Table(title=f"pld vs HF prompt lookup ({max_new_tokens} new tokens, each vs its own plain decoding)")
        for c in ("benchmark", "ours speedup", "ours tau", "HF speedup", "HF tau", "identical"):
            t.add_column(c)
        result["pld_vs_hf"] = {}
        for bench in pld_benchmarks:
            qs = load_questions(bench, data, limit=pld_prompts)
            prompts = [tgt.encode_chat([{"role": "user", "content": q.turns[0]}]) for q in qs]
            with console.status(f"pld vs HF prompt lookup on {bench}"):
                res = _contest(tgt, prompts, max_new_tokens, {
                    "ar": lambda p, n: _ours(tgt, p, n),
                    "pld": lambda p, n: _ours(tgt, p, n, drafter),
                    "hf": lambda p, n: _hf_generate(tgt, p, n),
                    "hf_pl": lambda p, n: _hf_generate(tgt, p, n, prompt_lookup_num_tokens=10),
                }, repeats=max(3, repeats // 2))
            same = res["ar"]["outputs"] == res["pld"]["outputs"] == res["hf"]["outputs"] == res["hf_pl"]["outputs"]
            row = {"ours_speedup": res["pld"]["tok_s"] / res["ar"]["tok_s"], "ours_tau": res["pld"]["tau"],
                   "hf_speedup": res["hf_pl"]["tok_s"] / res["hf"]["tok_s"], "hf_tau": res["hf_pl"]["tau"],
                   "pld_vs_hf_pl": res["pld"]["tok_s"] / res["hf_pl"]["tok_s"], "identical_outputs": same}
            result["pld_vs_hf"][bench] = row
            t.add_row(bench, f"{row['ours_speedup']:.2f}x", f"{row['ours_tau']:.2f}", f"{row['hf_speedup']:.2f}x",
                      f"{row['hf_tau']:.2f}", str(same))
        console.print(t)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        console.print(f"wrote {out}")
    return result
