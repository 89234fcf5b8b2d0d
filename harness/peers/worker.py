"""Run one official implementation (a peer) on pre-tokenized prompts, inside the peer's own
virtual environment (scripts/setup_peers.sh): `python -m harness.peers.worker JOB.json`.

This module is the only project code that runs there, so it imports the standard library, torch
and the peer's own modules, nothing else of specbench. It puts the peer's folder on sys.path,
shims what the peer needs a GPU or an unused dependency for (below), builds the peer's model the
way the peer's own runner script does, and calls the peer's own forward function for each prompt
(Spec-Bench's `evaluation/inference_*.py:*_forward`, EAGLE's `eagenerate`, ...). One JSON line per
answer is appended to the job's output file as it finishes; answers already there are skipped,
so a killed worker resumes.

JOB.json: {"adapter": name in ADAPTERS, "peer_dir": folder, "base": target folder in the layout
the peer's transformers reads, "drafter": folder of the drafter weights in the official layout
or null, "settings": the peer's own knobs, "dtype": "float32" | "bfloat16", "threads": n,
"prompts": [{"key", "ids", "max_new_tokens", "temperature"}], "out": results .jsonl}
A result line: {"key", "output_ids", "accept_lengths" (new tokens per verify step, the peer's own
count), "prefill_step" (whether the peer's first step is its prefill: transformers-style loops
feed the prompt with the first drafts, EAGLE's code prefills apart), "wall_s"}.
"""
from __future__ import annotations

import importlib
import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

Generate = Callable[[list[int], int, float], tuple[list[int], list[int]]]


# ----------------------------------------------------------------------------- shims
def cpu_shims() -> None:
    """The peers were written for CUDA: `.cuda()` keeps a tensor or module where it is, and the
    synchronisations their timers call are no-ops on the CPU."""
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None


def fastchat_shim() -> None:
    """Spec-Bench's runner scripts import FastChat for prompt templates and a dtype helper; we feed
    token ids templated once by specbench, so a stand-in with those two names is enough."""
    if "fastchat" in sys.modules:
        return
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
    utils = types.ModuleType("fastchat.utils")
    utils.str_to_torch_dtype = lambda s: dtypes.get(s)
    model = types.ModuleType("fastchat.model")
    model.get_conversation_template = lambda *a, **k: None
    judge = types.ModuleType("fastchat.llm_judge")
    common = types.ModuleType("fastchat.llm_judge.common")
    common.load_questions = lambda *a, **k: []
    pkg = types.ModuleType("fastchat")
    pkg.utils, pkg.model, pkg.llm_judge, judge.common = utils, model, judge, common
    sys.modules.update({"fastchat": pkg, "fastchat.utils": utils, "fastchat.model": model,
                        "fastchat.llm_judge": judge, "fastchat.llm_judge.common": common})


class Inputs:
    """What Spec-Bench's forward functions take: a tokenizer's output, `input_ids` [1, P]."""

    def __init__(self, ids: list[int]) -> None:
        self.input_ids = torch.tensor([ids])
        self.attention_mask = torch.ones_like(self.input_ids)


def new_tokens(output: torch.Tensor, prompt_len: int) -> list[int]:
    return output[0, prompt_len:].tolist()


# ----------------------------------------------------------------------------- adapters
# An adapter builds the peer's model from the job and returns generate(ids, max_new_tokens, T) ->
# (new token ids, tokens per verify step). "ar" adapters run the peer's own plain decoding.

def _dtype(job: dict) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[job["dtype"]]


def spec_bench_hf_ar(job: dict) -> Generate:
    """Spec-Bench's baseline (`inference_baseline.py`): transformers' `generate`, greedy or sampled."""
    fastchat_shim()
    from transformers import AutoModelForCausalLM

    base = importlib.import_module("evaluation.inference_baseline")
    model = AutoModelForCausalLM.from_pretrained(job["base"], torch_dtype=_dtype(job)).eval()
    tokenizer = _tokenizer(job)

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = base.baseline_forward(Inputs(ids), model, tokenizer, max_new_tokens,
                                                       temperature=temperature or None, do_sample=temperature > 0)
        return new_tokens(out, len(ids)), acc
    return generate


def spec_bench_pld(job: dict) -> Generate:
    """Spec-Bench's prompt lookup (`inference_pld.py`: greedy_search_pld, window 3, 10 tokens)."""
    fastchat_shim()
    from transformers import AutoModelForCausalLM

    pld_module = importlib.import_module("model.pld.pld")
    pld_module.device = torch.device("cpu")   # a module-level cuda:0 the search never needs here
    runner = importlib.import_module("evaluation.inference_pld")
    model = AutoModelForCausalLM.from_pretrained(job["base"], torch_dtype=_dtype(job)).eval()
    model.greedy_search_pld = pld_module.greedy_search_pld.__get__(model, type(model))
    tokenizer = _tokenizer(job)

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.pld_forward(Inputs(ids), model, tokenizer, max_new_tokens)
        return new_tokens(out, len(ids)), acc
    return generate


def spec_bench_eagle2(job: dict) -> Generate:
    """Spec-Bench's EAGLE-2 (`inference_eagle2.py`: EaModel.eagenerate, total_token/depth/top_k)."""
    fastchat_shim()
    ea = importlib.import_module("model.eagle2.ea_model")
    runner = importlib.import_module("evaluation.inference_eagle2")
    s = job["settings"]
    model = ea.EaModel.from_pretrained(base_model_path=job["base"], ea_model_path=job["drafter"],
                                       total_token=s["total_token"], depth=s["depth"], top_k=s["top_k"],
                                       torch_dtype=_dtype(job)).eval()

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.ea_forward(Inputs(ids), model, model.get_tokenizer(), max_new_tokens,
                                                   temperature=temperature)
        return new_tokens(out, len(ids)), acc
    return generate


def eagle_naive_ar(job: dict) -> Generate:
    """The EAGLE code's own plain decoding (`EaModel.naivegenerate`, its speed baseline)."""
    ea = importlib.import_module(job["settings"]["module"])
    model = ea.EaModel.from_pretrained(base_model_path=job["base"], ea_model_path=job["drafter"],
                                       total_token=60, depth=5, top_k=10, torch_dtype=_dtype(job)).eval()

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps = model.naivegenerate(torch.tensor([ids]), temperature=temperature,
                                                max_new_tokens=max_new_tokens, log=True)
        tokens = new_tokens(out, len(ids))
        return tokens, [1] * len(tokens)
    return generate


def _tokenizer(job: dict):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(job["base"])


# name -> (builder, whether the peer's first verify step also holds its prefill)
ADAPTERS: dict[str, tuple[Callable[[dict], Generate], bool]] = {
    "spec-bench/ar": (spec_bench_hf_ar, True),
    "spec-bench/pld": (spec_bench_pld, True),
    "spec-bench/eagle2": (spec_bench_eagle2, False),
    "eagle/ar": (eagle_naive_ar, True),
}


# ----------------------------------------------------------------------------- the job
def done_keys(out: Path) -> set[str]:
    """Keys of the answers already in the results file (a torn last line is dropped)."""
    if not out.exists():
        return set()
    keys, lines = set(), out.read_text().splitlines()
    for line in lines:
        try:
            keys.add(json.loads(line)["key"])
        except (json.JSONDecodeError, KeyError):
            continue
    return keys


def run(job: dict) -> int:
    torch.set_num_threads(int(job.get("threads") or 1))
    cpu_shims()
    sys.path.insert(0, str(Path(job["peer_dir"]).resolve()))
    build, prefill_step = ADAPTERS[job["adapter"]]
    generate = build(job)
    out = Path(job["out"])
    done = done_keys(out)
    with torch.no_grad():  # as the peers decode (inference-mode tensors would refuse their in-place cache updates)
        generate(job["prompts"][0]["ids"], 8, 0.0)  # warm-up: first-call allocations are not the method's
    for p in job["prompts"]:
        if p["key"] in done:
            continue
        if p.get("seed") is not None:
            torch.manual_seed(int(p["seed"]))
        start = time.perf_counter()
        output_ids, accept = generate(p["ids"], int(p["max_new_tokens"]), float(p["temperature"]))
        wall = time.perf_counter() - start
        with out.open("a") as f:
            f.write(json.dumps({"key": p["key"], "output_ids": [int(t) for t in output_ids],
                                "accept_lengths": [int(a) for a in accept], "prefill_step": prefill_step,
                                "wall_s": round(wall, 4)}) + "\n")
        print(json.dumps({"done": p["key"], "tokens": len(output_ids)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(json.loads(Path(sys.argv[1]).read_text())))
