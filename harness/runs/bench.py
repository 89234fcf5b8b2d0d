"""`cli.py bench`: the machine's cost curve and head-to-head checks against transformers.

1. Cost curve: time of one cached forward of k tree tokens at given context lengths, as ratios to
   k = 1 (what a tree budget costs here: the input for choosing tree sizes and pld's chain length).
2. Our AR loop vs HF `generate` (greedy), same prompts, dtype and threads, both warmed up; with
   --compile also our AR loop on the compiled runtime (harness/core/runtime.py), which the
   --pld / --assisted contests then use for our side.
3. (--pld) our `pld` vs HF prompt lookup (`generate(prompt_lookup_num_tokens=10)`), and
   (--assisted DRAFT) our `sps` with that draft model vs HF assisted generation
   (`generate(assistant_model=...)`), each against its own stack's plain decoding, with tau for
   both (HF's steps counted through a streamer), pooled over the prompts as everywhere else
   (`metrics.TAU`: Σ new tokens / Σ verify steps).
Every run first prints the memory-bandwidth floor of a decode step (weight bytes / measured copy
bandwidth): how far the runtime is from what the machine allows.
All timings are medians of interleaved repeats, so drift hits every contender alike.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from harness.core.cost_model import CURVE_SIZES, forward_cost_ms, median_ms
from harness.core.decode import GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.machine_meta import collect_meta, contention_warning
from harness.core.target import Target
from harness.core.timing import Clock
from harness.runs.benchmarks import load_questions, resolve_data_dir
from harness.runs.metrics import TAU


def weight_bytes(target: Target) -> int:
    """Bytes of the target's weights a decode step reads (tied embedding / LM head counted once)."""
    seen, total = set(), 0
    for prm in target.model.parameters():
        if prm.data_ptr() not in seen:
            seen.add(prm.data_ptr())
            total += prm.numel() * prm.element_size()
    return total


def copy_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 5) -> float:
    """Measured memory bandwidth in bytes/s: a `megabytes` tensor copy reads and writes it once,
    so 2x its size moves per copy (median of `repeats`)."""
    src = torch.ones(megabytes << 18, dtype=torch.float32, device=device)  # << 18: MB -> float32 count
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing

    def copy() -> None:
        dst.copy_(src)

    ms = median_ms(copy, repeats, device)
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


class _StepCounter:
    """A transformers streamer that counts generation steps: put() is called once with the prompt,
    then once per forward with the tokens that forward added."""

    def __init__(self) -> None:
        self.puts: list[int] = []

    def put(self, value) -> None:
        self.puts.append(int(value.numel()))

    def end(self) -> None:
        pass

    def tau_terms(self) -> tuple[int, int]:
        """(new tokens, forwards) after the prompt: the answer's terms of `metrics.TAU`."""
        steps = self.puts[1:]
        return sum(steps), len(steps)


def hf_generate(target: Target, ids: list[int], max_new: int, **kw) -> tuple[list[int], float, tuple[int, int]]:
    """HF `generate` (greedy): (new tokens, seconds, (tokens, forwards) for τ)."""
    counter = _StepCounter()
    inp = torch.tensor([ids], device=target.input_device)
    clock = Clock(target.devices)
    t0 = clock.now()
    out = target.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new,
                                do_sample=False, streamer=counter, pad_token_id=next(iter(target.eos_token_ids), 0),
                                eos_token_id=sorted(target.eos_token_ids) or None, **kw)
    dt = clock.now() - t0
    return out[0, len(ids):].tolist(), dt, counter.tau_terms()


def ours_generate(target: Target, ids: list[int], max_new: int,
                  drafter=None) -> tuple[list[int], float, tuple[int, int]]:
    """Our loop (greedy): (new tokens, seconds, (tokens, verify steps) for τ)."""
    g = generate(target, ids, GenerationConfig(max_new), drafter)
    return g.output_ids, g.wall_s, (sum(g.tokens), len(g.tokens))


def on_runtime(target: Target, runtime, fn):
    """`fn` run with the target's runtime set to `runtime` (None: transformers' layers)."""
    def call(*args):
        saved, target.runtime = target.runtime, runtime
        try:
            return fn(*args)
        finally:
            target.runtime = saved
    return call


def contest(target: Target, prompts: list[list[int]], max_new: int, contenders: dict[str, Any],
             repeats: int) -> dict[str, dict[str, float]]:
    """Interleaved repeats: every round runs each contender once on every prompt; tok/s per round,
    median over rounds; τ pooled over the first round's answers (`metrics.TAU`). A contender is
    `fn(prompt, max_new) -> (new tokens, seconds, (tokens, steps))`. Returns {name: {"tok_s",
    "tau", "outputs"}}."""
    for fn in contenders.values():  # warm-up
        fn(prompts[0], min(16, max_new))
    rounds: dict[str, list[float]] = {n: [] for n in contenders}
    terms: dict[str, list[tuple[int, int]]] = {n: [] for n in contenders}
    outputs: dict[str, list[list[int]]] = {n: [] for n in contenders}
    for r in range(repeats):
        names = list(contenders)
        names = names[r % len(names):] + names[: r % len(names)]
        for name in names:
            tokens, secs = 0, 0.0
            for i, p in enumerate(prompts):
                out, dt, counts = contenders[name](p, max_new)
                tokens += len(out)
                secs += dt
                if r == 0:
                    outputs[name].append(out)
                    terms[name].append(counts)
            rounds[name].append(tokens / secs)
    return {n: {"tok_s": statistics.median(rounds[n]),
                "tau": float(TAU.estimate(np.array(terms[n], dtype=float).reshape(-1, 2))),
                "outputs": outputs[n]} for n in contenders}


def output_agreement(res: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Which contenders gave the same outputs, pair by pair: in bf16 a tree forward rounds otherwise
    than a 1-token step, so the pairs say where a difference sits (our stack, HF's, or between them)."""
    return {"ours_vs_ar": res["ours"]["outputs"] == res["ar"]["outputs"],
            "hf_spec_vs_hf": res["hf_spec"]["outputs"] == res["hf"]["outputs"],
            "ar_vs_hf": res["ar"]["outputs"] == res["hf"]["outputs"]}


def _speculative_contest(tgt: Target, name: str, drafter, hf_name: str, hf_kwargs: dict[str, Any],
                         benchmarks: list[str], n_prompts: int, data: Path, max_new_tokens: int, repeats: int,
                         console: Console) -> dict[str, dict[str, Any]]:
    """Our `name` drafter vs HF `generate(**hf_kwargs)` per benchmark, each against its own stack's
    plain decoding (speedups are ratios within one stack), tau for both, outputs compared."""
    t = Table(title=f"{name} vs {hf_name} ({max_new_tokens} new tokens, each vs its own plain decoding)")
    for c in ("benchmark", "ours speedup", "ours tau", "HF speedup", "HF tau", f"{name} / HF tok/s", "identical"):
        t.add_column(c)
    rows = {}
    for bench in benchmarks:
        qs = load_questions(bench, data, limit=n_prompts)
        prompts = [tgt.encode_chat([{"role": "user", "content": q.turns[0]}]) for q in qs]
        with console.status(f"{name} vs {hf_name} on {bench}"):
            res = contest(tgt, prompts, max_new_tokens, {
                "ar": lambda p, n: ours_generate(tgt, p, n),
                "ours": lambda p, n: ours_generate(tgt, p, n, drafter),
                "hf": lambda p, n: hf_generate(tgt, p, n),
                "hf_spec": lambda p, n: hf_generate(tgt, p, n, **hf_kwargs),
            }, repeats=max(3, repeats // 2))
        pairs = output_agreement(res)
        same = all(pairs.values())
        row = {"ours_speedup": res["ours"]["tok_s"] / res["ar"]["tok_s"], "ours_tau": res["ours"]["tau"],
               "hf_speedup": res["hf_spec"]["tok_s"] / res["hf"]["tok_s"], "hf_tau": res["hf_spec"]["tau"],
               "ours_vs_hf_tok_s": res["ours"]["tok_s"] / res["hf_spec"]["tok_s"],
               "tok_s": {k: v["tok_s"] for k, v in res.items()}, "identical_outputs": same,
               "identical_pairs": pairs}
        rows[bench] = row
        t.add_row(bench, f"{row['ours_speedup']:.2f}x", f"{row['ours_tau']:.2f}", f"{row['hf_speedup']:.2f}x",
                  f"{row['hf_tau']:.2f}", f"{row['ours_vs_hf_tok_s']:.2f}x", str(same))
    console.print(t)
    return rows


def run_bench(*, target: str, dtype: str, device: str, contexts: list[int], sizes: list[int], repeats: int,
              ar_prompts: int, max_new_tokens: int, pld: bool, contest_benchmarks: list[str], contest_prompts: int,
              data_dir: Path | None, out: Path | None, console: Console, assisted: str | None = None,
              compile_: bool = False) -> dict[str, Any]:
    warn = contention_warning()
    if warn:
        console.print(f"[yellow]warning:[/] {warn}")
    if 1 not in sizes:
        raise SpecbenchError("--sizes must include 1 (the ratios are taken against a 1-token step)")
    # The prompts are needed only after minutes of measurement: a missing folder fails now instead.
    data = resolve_data_dir(data_dir) if (ar_prompts or pld or assisted) else None
    with console.status(f"loading {target}"):
        tgt = Target.load(target, device, dtype)
    eager_runtime = tgt.runtime  # the default: packed weights, no compile (None where the layers need transformers')
    if compile_:
        tgt.enable_compile()
        if pld or assisted:
            with console.status(f"compiling every row bucket up to {max(CURVE_SIZES)} (minutes the first time on a machine)"):
                tgt.runtime.warm_up_to(max(CURVE_SIZES))
    dt_name = str(tgt.dtype).replace("torch.", "")
    meta = collect_meta()
    result: dict[str, Any] = {"target": target, "dtype": dt_name, "threads": torch.get_num_threads(), "compile": compile_,
                              "cpu_kind": meta["cpu_kind"] if tgt.device.type == "cpu" else meta["gpu"], "meta": meta}

    with console.status("memory bandwidth"):
        nbytes, bandwidth = weight_bytes(tgt), copy_bandwidth(tgt.device)
    floor_ms = nbytes / bandwidth * 1e3
    result["floor"] = {"weight_bytes": nbytes, "copy_bandwidth_gb_s": bandwidth / 1e9, "step_floor_ms": floor_ms,
                       "tok_s_ceiling": 1e3 / floor_ms}
    console.print(f"memory-bandwidth floor of a decode step: {nbytes / 1e6:.0f} MB of weights / "
                  f"{bandwidth / 1e9:.1f} GB/s copy bandwidth = {floor_ms:.1f} ms ({1e3 / floor_ms:.0f} tok/s at most)")
    with console.status("cost curve"):
        curve = forward_cost_ms(tgt, contexts, sizes, repeats)
    result["cost_curve_ms"] = curve
    table = Table(title=f"one forward of k tree tokens, {target} {dt_name}, {result['cpu_kind']}, "
                        f"{result['threads']} threads: ms (ratio to k=1)")
    table.add_column("context")
    for k in sizes:
        table.add_column(f"k={k}")
    for ctx, row in curve.items():
        table.add_row(str(ctx), *[f"{row[k]:.1f} ({row[k] / row[1]:.2f}x)" for k in sizes])
    console.print(table)

    if ar_prompts:
        qs = load_questions("mt_bench", data, limit=ar_prompts)
        prompts = [tgt.encode_chat([{"role": "user", "content": q.turns[0]}]) for q in qs]
        contenders = {"ours": on_runtime(tgt, eager_runtime, lambda p, n: ours_generate(tgt, p, n)),
                      "ours_transformers_layers": on_runtime(tgt, None, lambda p, n: ours_generate(tgt, p, n)),
                      "hf": on_runtime(tgt, None, lambda p, n: hf_generate(tgt, p, n))}
        if compile_:
            contenders["ours_compiled"] = lambda p, n: ours_generate(tgt, p, n)
        with console.status("AR loop vs HF generate" + (" (compiling first)" if compile_ else "")):
            res = contest(tgt, prompts, max_new_tokens, contenders, repeats=max(3, repeats // 2))
        same = res["ours"]["outputs"] == res["hf"]["outputs"]
        ratio = res["ours"]["tok_s"] / res["hf"]["tok_s"]
        ceiling = result["floor"]["tok_s_ceiling"]
        result["ar_vs_hf"] = {"ours_tok_s": res["ours"]["tok_s"], "hf_tok_s": res["hf"]["tok_s"],
                              "ratio": ratio, "identical_outputs": same, "prompts": len(prompts),
                              "max_new_tokens": max_new_tokens, "floor_share": res["ours"]["tok_s"] / ceiling}
        tl = res["ours_transformers_layers"]
        result["ar_vs_hf"].update({"runtime": eager_runtime.name if eager_runtime is not None else "transformers",
                                   "transformers_layers_tok_s": tl["tok_s"],
                                   "runtime_vs_transformers_layers": res["ours"]["tok_s"] / tl["tok_s"],
                                   "identical_to_transformers_layers": tl["outputs"] == res["ours"]["outputs"]})
        console.print(f"AR loop: ours {res['ours']['tok_s']:.2f} tok/s, HF generate {res['hf']['tok_s']:.2f} tok/s "
                      f"-> {ratio:.3f}x; identical outputs: {same}; "
                      f"{result['ar_vs_hf']['floor_share']:.0%} of the bandwidth ceiling; on transformers' layers "
                      f"{tl['tok_s']:.2f} tok/s (ours {result['ar_vs_hf']['runtime_vs_transformers_layers']:.2f}x that)")
        if "ours_compiled" in res:
            c = res["ours_compiled"]
            result["ar_vs_hf"].update({
                "compiled_tok_s": c["tok_s"], "compiled_vs_eager": c["tok_s"] / res["ours"]["tok_s"],
                "compiled_vs_hf": c["tok_s"] / res["hf"]["tok_s"], "compiled_floor_share": c["tok_s"] / ceiling,
                "compiled_identical_to_eager": c["outputs"] == res["ours"]["outputs"],
                "compile_mode": tgt.runtime.mode})
            a = result["ar_vs_hf"]
            console.print(f"AR loop compiled ({tgt.runtime.mode}): {c['tok_s']:.2f} tok/s = "
                          f"{a['compiled_vs_eager']:.2f}x eager, {a['compiled_vs_hf']:.2f}x HF generate; "
                          f"identical to eager: {a['compiled_identical_to_eager']}; "
                          f"{a['compiled_floor_share']:.0%} of the bandwidth ceiling")

    if pld or assisted:
        from methods.registry import get_method
    if pld:
        result["pld_vs_hf"] = _speculative_contest(
            tgt, "pld", get_method("pld")(tgt), "HF prompt lookup", {"prompt_lookup_num_tokens": 10},
            contest_benchmarks, contest_prompts, data, max_new_tokens, repeats, console)
    if assisted:
        drafter = get_method("sps")(tgt, {"draft": assisted})
        # HF's assisted generation as it ships: its assistant config (20 tokens, constant
        # schedule, stop below 0.4 draft confidence) unless the draft model's own says otherwise.
        result["sps_vs_hf_assisted"] = _speculative_contest(
            tgt, "sps", drafter, "HF assisted generation", {"assistant_model": drafter.draft.model},
            contest_benchmarks, contest_prompts, data, max_new_tokens, repeats, console)
        result["sps_config"] = drafter.config
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        console.print(f"wrote {out}")
    return result
