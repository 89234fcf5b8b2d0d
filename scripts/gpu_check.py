"""The GPU path, checked in minutes on a bare GPU box (issue 31):

  python scripts/gpu_check.py --out gpu_check.json                  # the device torch sees (cuda: <= 8 min, H100)
  python scripts/gpu_check.py --device cpu --quick --out FILE        # CI: <= 2 min on one core

Needs only the code folders (harness/ methods/ scripts/ cli.py), torch, transformers,
accelerate, safetensors, tokenizers, typer, rich, pandas, matplotlib, pytest (+ the jsonlines and
gguf wheels); no network, no checkpoints/, datasets/ or ../shared: every target, drafter, tokenizer
and prompt is made here, random-initialised and seeded, in a scratch folder. Checks, each one row
of the JSON and of the summary (which method, which check, by how much):

  exactness      every method (random weights) + the oracle drafter: greedy float32 output == AR's
  near_ties      the same in bfloat16 and float16: every divergence from AR must be a near tie
                 (AR's top-2 gap within 2 bf16 ulps of its top-1 logit at the first differing token)
  law            T = 1 on the small target: the law of the first two tokens under each method (and a
                 drafter proposing the target's likely tokens) equals AR's exact law (chi-square,
                 p > 1e-3); a biased rule (no residual) must be rejected (p < 1e-6)
  cost_curve     one verify of k = 1..128 tree tokens against a 1-token step (a GPU's stays flat far
                 longer than a CPU's)
  ar_vs_hf       our AR loop's tokens/s against HF `generate` on the same model, outputs compared
  compare        `compare` over random-init drafters in float16, tables and plots written
  official       synthetic checkpoints in the official layouts (Medusa, Hydra, EAGLE, EAGLE-3,
                 Gumiho) loaded onto a hub-format target folder: exact in float32, ties in float16
  imports        what the code folders imported beyond the standard library and the packages above
Targets: Llama- and Qwen2-shaped, small (all checks) and ~1 B parameters (exactness, near ties,
cost curve, AR vs HF; skipped with --quick). Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import builtins
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CODE = ("harness", "methods", "scripts", "cli")
# What the issue lets the code import on the box, and what those install with them.
ALLOWED = {"torch", "transformers", "accelerate", "safetensors", "tokenizers", "sentencepiece", "typer", "rich",
           "pandas", "matplotlib", "pytest", "jsonlines", "gguf",
           "numpy", "huggingface_hub"}  # numpy comes with torch/pandas, huggingface_hub with transformers


# ----------------------------------------------------------------------------- guards

class Guards:
    """Records (1) files opened under checkpoints/, datasets/, results/ or ../shared, and (2) modules the
    code folders import beyond the standard library and ALLOWED. Installed before any code import."""

    def __init__(self) -> None:
        self.reads: set[str] = set()
        self.imports: dict[str, str] = {}
        self.forbidden = [REPO / "checkpoints", REPO / "datasets", REPO / "results", REPO.parent / "shared"]
        # The benchmark manifest (titles and hashes, read where present; a copy without it runs alike).
        self.harmless = {REPO / "datasets" / "benchmarks.json"}
        sys.addaudithook(self._audit)
        self._import = builtins.__import__
        builtins.__import__ = self._watched_import

    def _audit(self, event: str, args) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)) or not self._reading(*args[1:3]):
            return
        try:
            path = Path(os.fsdecode(args[0])).resolve()
        except (OSError, ValueError):
            return
        if path not in self.harmless and any(path.is_relative_to(f) for f in self.forbidden):
            self.reads.add(str(path))

    @staticmethod
    def _reading(mode, flags) -> bool:
        """Whether an open is a read (`--out` may name a file under results/: writing there is fine)."""
        if isinstance(mode, str):
            return not set(mode) & set("wax+")
        return not (flags or 0) & (os.O_WRONLY | os.O_RDWR)

    def _watched_import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and globals:
            top = name.split(".")[0]
            here = globals.get("__name__", "").split(".")[0]
            if (here in CODE or here == "__main__") and top not in CODE and top not in ALLOWED and top not in sys.stdlib_module_names:
                self.imports.setdefault(top, globals.get("__name__", "?"))
        return self._import(name, globals, locals, fromlist, level)


GUARDS = Guards()

import torch  # noqa: E402

from harness.core.decode import GenerationConfig, generate  # noqa: E402
from harness.core.target import Target  # noqa: E402
from harness.runs.metrics import bf16_ulp, first_divergence  # noqa: E402
from harness.testing.hub_layouts import (OFFICIAL_LAYOUTS, make_tokenizer, random_model, text_of, vicuna_like,  # noqa: E402
                               write_hub_target, write_official)
from harness.testing.oracle import OracleDrafter  # noqa: E402
from harness.testing.random_drafters import (builtin_methods, datastore_settings, layers_needed, method_settings,  # noqa: E402
                                   perturbed_copy, random_drafter)

HALF = (torch.bfloat16, torch.float16)
LOGIT_STD = 5.0
CURVE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
QUICK_LAW = ("medusa", "eagle2", "sps")
SECTIONS = ("exactness", "near_ties", "law", "cost_curve", "ar_vs_hf", "compare", "official")
# How much each check runs. answers: (prompts, new tokens) per target size; law: samples per method;
# curve: (context, repeats); ar_vs_hf: (prompts, new tokens, repeats); compare / official: (prompts,
# new tokens); budget: draft tokens per verify (a CPU-sized tree, or the papers' ~60 on a GPU).
# "full" is sized for <= 8 min on one H100: a 1 B target steps in ~10-20 ms there, eagerly.
PLANS = {
    "quick": {"answers": {"small": (2, 20)}, "law_samples": 1000, "curve": (128, 2), "ar_vs_hf": (1, 16, 1),
              "compare": (2, 12), "official": (2, 16), "budget": 15},
    "full": {"answers": {"small": (4, 48), "large": (2, 32)}, "law_samples": 2000, "curve": (512, 7),
             "ar_vs_hf": (2, 64, 2), "compare": (4, 48), "official": (4, 48), "budget": 59},
}
# The CPU's curves for comparison (SmolLM2-135M, 2 Sapphire Rapids cores: methods/pld.py's defaults).
CPU_REFERENCE = {"float32": {32: 2.55, 64: 3.82}, "bfloat16": {32: 1.29, 64: 1.61}}


def shapes(quick: bool) -> dict[str, tuple[str, dict]]:
    """name -> (architecture, sizes). Small: every check; ~1 B: TinyLlama-1.1B's and Qwen2.5-1.5B's shapes."""
    small = dict(vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2)
    out = {"llama-small": ("llama", small), "qwen2-small": ("qwen2", small)}
    if not quick:
        out["llama-1b"] = ("llama", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                         num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4))
        out["qwen2-1b"] = ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2))
    return out


def sharpen(hidden: int) -> float:
    """The factor on a random LM head that gives logits of standard deviation LOGIT_STD (the final
    norm's output has rms 1, the head's init std is 0.02): greedy text that is not a run of near
    ties, and a law at T = 1 concentrated enough that a chi-square test over its cells has power."""
    return LOGIT_STD / (0.02 * hidden ** 0.5)


def model_config(arch: str, sizes: dict):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(max_position_embeddings=4096, bos_token_id=None, eos_token_id=None, pad_token_id=None, **sizes)
    if arch == "llama":
        return LlamaConfig(tie_word_embeddings=False, **common)
    return Qwen2Config(tie_word_embeddings=True, rope_theta=1e6, **common)  # q/k/v biases, tied head


# ----------------------------------------------------------------------------- results

@dataclass
class Check:
    section: str
    target: str
    dtype: str
    method: str
    ok: bool | None          # None: a measurement, no pass/fail
    detail: str
    data: dict = field(default_factory=dict)


class Report:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.checks: list[Check] = []
        self.sections: dict[str, dict[str, float]] = {}
        self.started = time.perf_counter()
        self.extra: dict = {}

    def add(self, section: str, target: str, dtype, method: str, ok: bool | None, detail: str, **data) -> None:
        dtype = str(dtype).replace("torch.", "")
        self.checks.append(Check(section, target, dtype, method, ok, detail, data))
        mark = {True: "ok  ", False: "FAIL", None: "info"}[ok]
        print(f"  {mark} {section:<10} {target:<12} {dtype:<9} {method:<8} {detail}", flush=True)

    @contextmanager
    def unit(self, section: str, target: str, dtype, method: str):
        """A failing unit is one FAIL row naming the error and where it was raised, and the check goes on."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - every failure becomes a row a reader can act on
            frames = [f for f in traceback.extract_tb(e.__traceback__) if str(REPO) in f.filename]
            where = f" at {Path(frames[-1].filename).relative_to(REPO)}:{frames[-1].lineno}" if frames else ""
            self.add(section, target, dtype, method, False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                     f"{where}", traceback=traceback.format_exc(limit=-6))

    @contextmanager
    def section(self, name: str):
        print(f"[{name}]", flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        yield
        # wall and this process's CPU seconds: on a shared machine the first grows, the second does not
        self.sections[name] = {"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}

    def write(self, out: Path | None) -> int:
        from harness.core.machine_meta import collect_meta

        failures = [c for c in self.checks if c.ok is False]
        doc = {"args": {k: str(v) for k, v in vars(self.args).items()},
               "elapsed_s": round(time.perf_counter() - self.started, 1), "cpu_s": round(time.process_time(), 1),
               "sections_s": self.sections, "environment": environment(), "meta": collect_meta(),
               "passed": not failures, "failures": [asdict(c) for c in failures],
               "checks": [asdict(c) for c in self.checks], **self.extra}
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"\n{len(self.checks)} checks in {doc['elapsed_s']} s wall, {doc['cpu_s']} s CPU ("
              + ", ".join(f"{k} {v['wall_s']}s" for k, v in self.sections.items()) + ")")
        if failures:
            print(f"FAILED {len(failures)}:")
            for c in failures:
                print(f"  {c.section} / {c.target} / {c.dtype} / {c.method}: {c.detail}")
            print("  (exactness / near_ties / law failures point at a mask, position, cache or sampling bug on this "
                  "device: rerun `pytest --device DEVICE tests/test_device_dtypes.py tests/test_exactness.py "
                  "tests/test_tree_verify.py tests/test_sampling.py`; details and tracebacks are in the JSON)")
        else:
            print("all checks passed")
        if out:
            print(f"wrote {out}")
        return 1 if failures else 0


def environment() -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
           "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


# ----------------------------------------------------------------------------- targets and prompts

class Targets:
    """The random targets: small ones written as hub folders and loaded by `Target.load` (the loader,
    tokenizer and dtype paths), ~1 B ones built in memory on the device (writing 5 GB would cost
    more than the checks). Seeded: one seed per shape."""

    def __init__(self, work: Path, device: torch.device, quick: bool) -> None:
        self.work, self.device, self.shapes = work, device, shapes(quick)
        self.folders: dict[str, Path] = {}

    def folder(self, name: str) -> Path:
        if name not in self.folders:
            arch, sizes = self.shapes[name]
            self.folders[name] = write_hub_target(self.work / "targets" / name, model_config(arch, sizes),
                                                  seed=list(self.shapes).index(name),
                                                  sharpen=sharpen(sizes["hidden_size"]))
        return self.folders[name]

    def load(self, name: str, dtype: torch.dtype) -> Target:
        dt = str(dtype).replace("torch.", "")
        if name.endswith("-small"):
            target = Target.load(str(self.folder(name)), str(self.device), dt)
            target.name = name  # its folder is scratch: rows and caches use the shape's name
            return target
        arch, sizes = self.shapes[name]
        cfg = model_config(arch, sizes)
        with torch.device(self.device):  # initialised on the GPU (seconds), not on the host (a minute)
            model = random_model(cfg, list(self.shapes).index(name), sharpen(sizes["hidden_size"]))
        model = model.to(device=self.device, dtype=dtype)
        return Target(model, make_tokenizer(cfg.vocab_size), name, self.device, dtype)

    def names(self) -> list[str]:
        return list(self.shapes)


def size_class(name: str) -> str:
    return "small" if name.endswith("-small") else "large"


def make_prompts(vocab: int, n: int, seed: int, length: int = 48) -> list[list[int]]:
    """Random token prompts of about `length` tokens, each a random segment repeated with a variation
    (prompt lookup finds n-grams, as in real prompts)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seg = torch.randint(0, vocab, (max(4, length // 3),), generator=g).tolist()
        out.append(seg + seg[: len(seg) // 2] + seg)
    return out


def per_prompt_drafters(target: Target, method: str, budget: int, prompts: list[list[int]], ars) -> list:
    """The drafter each prompt runs with: one random-initialised `method` drafter for all
    (harness/testing/random_drafters.py), or for "oracle" one that knows that prompt's AR answer."""
    if method == "oracle":
        return [OracleDrafter(target, {"continuation": ar.output_ids, "prompt_len": len(p), "seed": i})
                for i, (p, ar) in enumerate(zip(prompts, ars))]
    if target.num_layers < layers_needed(method):
        raise RuntimeError(f"{method} needs a target of {layers_needed(method)} layers, {target.name} has "
                           f"{target.num_layers}")
    return [random_drafter(target, method, budget)] * len(prompts)


# ----------------------------------------------------------------------------- checks

def check_exactness(rep: Report, tg: Targets, methods: list[str], answers: dict, budget: int) -> None:
    """Every method's greedy float32 output equals AR's, token for token (the oracle makes sure
    the accept-and-commit path runs with long accepted paths)."""
    for name in tg.names():
        n, tokens = answers[size_class(name)]
        with rep.unit("exactness", name, "float32", "load"):
            target = tg.load(name, torch.float32)
            prompts = make_prompts(target.vocab_size, n, seed=1)
            cfg = GenerationConfig(tokens)
            ars = [generate(target, p, cfg) for p in prompts]
            for method in [*methods, "oracle"]:
                with rep.unit("exactness", name, "float32", method):
                    bad, taus, drafted = [], [], 0
                    ds = per_prompt_drafters(target, method, budget, prompts, ars)
                    for i, (p, ar, d) in enumerate(zip(prompts, ars, ds)):
                        sp = generate(target, p, cfg, d)
                        taus.append(sp.tau)
                        drafted += sum(sp.tree_size)
                        if sp.output_ids != ar.output_ids:
                            pos = next((j for j, (a, b) in enumerate(zip(sp.output_ids, ar.output_ids)) if a != b),
                                       min(len(sp.output_ids), len(ar.output_ids)))  # or where one stopped
                            bad.append({"prompt": i, "position": pos})
                    tau = sum(taus) / len(taus)
                    detail = (f"{len(bad)}/{n} answers differ from AR (first: prompt {bad[0]['prompt']}, token "
                              f"{bad[0]['position']})" if bad else f"{n}x{tokens} tokens identical to AR")
                    rep.add("exactness", name, "float32", method, not bad, f"{detail}; tau {tau:.2f}, "
                            f"{drafted} drafts verified", mismatches=bad, tau=tau, drafted=drafted)
            del target, ars


def check_near_ties(rep: Report, tg: Targets, names: list[str], methods: list[str], answers: dict,
                    budget: int) -> None:
    """In half precision a tree forward rounds otherwise than a 1-token step, so an answer may leave
    AR's where AR's top two logits were within rounding: allowed (a near tie), anything wider is not."""
    for name in names:
        n, tokens = answers[size_class(name)]
        for dtype in HALF:
            with rep.unit("near_ties", name, dtype, "load"):
                target = tg.load(name, dtype)
                prompts = make_prompts(target.vocab_size, n, seed=2)
                ars = [generate(target, p, GenerationConfig(tokens, record_logit_gaps=True)) for p in prompts]
                for method in [*methods, "oracle"]:
                    with rep.unit("near_ties", name, dtype, method):
                        ties, wide = 0, []
                        ds = per_prompt_drafters(target, method, budget, prompts, ars)
                        for i, (p, ar, d) in enumerate(zip(prompts, ars, ds)):
                            sp = generate(target, p, GenerationConfig(tokens), d)
                            div = first_divergence(sp.output_ids, ar.output_ids, ar.top1, ar.gap, False)
                            if div is None:
                                continue
                            if div["near_tie"]:
                                ties += 1
                            else:
                                ulps = None if div["gap"] is None else div["gap"] / bf16_ulp(div["top1"])
                                wide.append({"prompt": i, **div, "gap_bf16_ulps": ulps})
                        detail = (f"{len(wide)}/{n} answers leave AR by more than a tie (prompt {wide[0]['prompt']}: "
                                  f"token {wide[0]['position']}, AR gap {wide[0]['gap_bf16_ulps'] or 0:.1f} bf16 ulps)"
                                  if wide else f"{ties}/{n} answers differ from AR, all at near ties")
                        rep.add("near_ties", name, dtype, method, not wide, detail, near_ties=ties, wide=wide)
                del target, ars


class LawDrafter:
    """Point-mass drafts of the target's own likely tokens: the 3 most probable second tokens under
    the exact law, given the root. It makes rejections of likely tokens common, where a wrong residual
    shows most, so the biased control has power whatever the random methods draft."""

    def __init__(self, law: dict[tuple[int, int], float]) -> None:
        self.law = law
        self.config: dict = {}

    def begin(self, *a) -> None:
        pass

    def propose(self, ctx):
        from harness.core.tree import DraftTree

        kids = sorted((p, t2) for (t1, t2), p in self.law.items() if t1 == ctx.root)[-3:]
        return DraftTree(torch.tensor([ctx.root] + [t for _, t in kids]), torch.tensor([-1] + [0] * len(kids)))

    def observe(self, step) -> None:
        pass


def check_law(rep: Report, tg: Targets, methods: list[str], samples: int, budget: int) -> None:
    """The first two tokens at T = 1 (harness/runs/law_sampling.py: the exact AR law, each sample the
    loop's own prefill and first step, forwards replayed where inputs repeat)."""
    from harness.runs.law_sampling import ForwardReplay, exact_law

    with rep.unit("law", "llama-small", "float32", "load"):
        target = tg.load("llama-small", torch.float32)
        prompt = make_prompts(target.vocab_size, 1, seed=3)[0]
        prompt += generate(target, prompt, GenerationConfig(8)).output_ids  # an answer under way
        law = exact_law(target, prompt, 1.0, 1.0)
        runs = [("ar", False), ("target-law", False), *[(m, False) for m in methods], ("target-law", True)]
        for method, biased in runs:
            # A replay per method: its prefill memo ignores which layers' inputs a drafter asks for (EAGLE-3).
            target.forward = ForwardReplay(target, prompt)
            try:
                law_run(rep, target, prompt, law, method, biased, samples, budget)
            finally:
                del target.forward  # back to the class method


def law_run(rep: Report, target: Target, prompt: list[int], law: dict, method: str, biased: bool, samples: int,
            budget: int) -> None:
    """One row of the law check: `method`'s samples against the exact law (`biased`: with the
    no-residual rule, which must be rejected)."""
    import harness.core.verify as verify_module
    from harness.core.verify import Sampling
    from harness.runs.law_sampling import ALPHA_FAIR, RootMemo, law_fit, sample_counts
    from scripts.check_lossless_law import ALPHA_BIASED, no_residual_rule

    label = method + (" (biased control)" if biased else "")
    with rep.unit("law", target.name, "float32", label):
        if method == "ar":
            drafter = None
        else:
            drafter = RootMemo(LawDrafter(law) if method == "target-law" else random_drafter(target, method, budget))
        real = verify_module.verify_lossless
        verify_module.verify_lossless = no_residual_rule if biased else real
        try:
            counts, accepted = sample_counts(target, prompt, drafter, Sampling(1.0, 1.0, "lossless"), samples)
        finally:
            verify_module.verify_lossless = real
        stat, df, p = law_fit(counts, law, samples)
        ok = p < ALPHA_BIASED if biased else p > ALPHA_FAIR
        if biased:
            detail = f"biased rule {'rejected' if ok else 'NOT rejected'}: chi2 {stat:.0f} on {df} df, p {p:.2g}"
        else:
            detail = f"chi2 {stat:.1f} on {df} df, p {p:.3g}; drafts accepted in {accepted}/{samples} samples"
            if ok and drafter is not None and accepted < samples // 10:
                detail += " (rarely exercised: random weights)"
        rep.add("law", target.name, "float32", label, ok, detail, chi2=stat, df=df, p=p, accepted=accepted)


def check_cost_curve(rep: Report, tg: Targets, context: int, repeats: int) -> None:
    """cost(k) / cost(1) for one verify of k chain tokens on `context` cached tokens."""
    from harness.core.cost_model import forward_cost_ms

    dtype = torch.bfloat16 if tg.device.type == "cuda" else torch.float32
    ref = CPU_REFERENCE[str(dtype).replace("torch.", "")]
    for name in tg.names():
        with rep.unit("cost_curve", name, dtype, "ar"):
            target = tg.load(name, dtype)
            ms = forward_cost_ms(target, [context], list(CURVE_SIZES), repeats)[context]
            ratio = {k: ms[k] / ms[1] for k in CURVE_SIZES}
            flat = max(k for k in CURVE_SIZES if ratio[k] <= 1.25)
            detail = (f"1 token {ms[1]:.2f} ms; k=32 {ratio[32]:.2f}x, k=64 {ratio[64]:.2f}x, k=128 {ratio[128]:.2f}x; "
                      f"within 1.25x up to k={flat} (CPU reference: k=32 {ref[32]}x, k=64 {ref[64]}x)")
            rep.add("cost_curve", name, dtype, "ar", None, detail, ms=ms, ratio=ratio, flat_to=flat, context=context)
            del target


def check_ar_vs_hf(rep: Report, tg: Targets, n: int, tokens: int, repeats: int) -> None:
    """Our AR loop (eager runtime, and on transformers' layers) against HF generate: same prompts,
    model and dtype, interleaved repeats (harness/runs/bench.py's contest)."""
    from harness.runs.bench import contest, hf_generate, on_runtime, ours_generate

    dtype = torch.bfloat16 if tg.device.type == "cuda" else torch.float32
    for name in tg.names():
        with rep.unit("ar_vs_hf", name, dtype, "ar"):
            target = tg.load(name, dtype)
            prompts = make_prompts(target.vocab_size, n, seed=4, length=96)
            eager = target.runtime
            res = contest(target, prompts, tokens, {
                "ours": on_runtime(target, eager, lambda p, m: ours_generate(target, p, m)),
                "ours_transformers_layers": on_runtime(target, None, lambda p, m: ours_generate(target, p, m)),
                "hf": on_runtime(target, None, lambda p, m: hf_generate(target, p, m))}, repeats)
            same = res["ours"]["outputs"] == res["hf"]["outputs"]
            tok_s = {k: v["tok_s"] for k, v in res.items()}
            ratio = tok_s["ours"] / tok_s["hf"]
            # float32 greedy must agree; in bf16 HF's kernels may break a near tie otherwise
            ok = same if dtype == torch.float32 else None
            detail = (f"ours {tok_s['ours']:.1f} tok/s ({target.runtime_name}) vs HF generate {tok_s['hf']:.1f} -> "
                      f"{ratio:.2f}x; transformers' layers {tok_s['ours_transformers_layers']:.1f}; "
                      f"outputs {'identical' if same else 'differ'}")
            rep.add("ar_vs_hf", name, dtype, "ar", ok, detail, tok_s=tok_s, ratio=ratio, identical=same,
                    prompts=n, max_new_tokens=tokens)
            del target


def compare_inputs(tg: Targets, name: str, methods: list[str], n: int, budget: int) -> tuple[Path, Path, dict]:
    """What `compare` reads, made in the scratch folder: every learned method's random weights saved as
    its checkpoint for target `name` (under checkpoints/<target folder>), a perturbed copy of the
    target as SpS's draft model, and a prompt file. Returns (prompt file, checkpoint root, --set settings)."""
    folder = tg.folder(name)
    shell = Target.load(str(folder), "cpu", "float32")
    ck_root = tg.work / "checkpoints"
    from methods.registry import method_info

    for m in methods:  # only learned drafters have weights to save; training-free ones take settings only
        if method_info(m).trainable and shell.num_layers >= layers_needed(m):
            d = random_drafter(shell, m, budget)
            if d.trainable:  # the training-free ones (REST, Token Recycling, SAM-Decoding) have no weights
                d.save_pretrained(ck_root / folder.relative_to(tg.work) / type(d).weights_name())
    draft = perturbed_copy(shell)
    draft.model.save_pretrained(tg.work / "targets" / "draft")
    draft.tokenizer.save_pretrained(tg.work / "targets" / "draft")
    prompt_file = tg.work / "prompts" / "question.jsonl"
    prompt_file.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"question_id": i, "category": "random", "turns": [text_of(p)]}
             for i, p in enumerate(make_prompts(shell.vocab_size, n, seed=5))]
    prompt_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    settings = {"sps.draft": str(tg.work / "targets" / "draft"), "sps.gamma": 4}
    for m in methods:  # inference keys only: the architecture (full vocabulary) is in each checkpoint
        if m != "sps":  # its settings are above
            extra = {**method_settings(m, budget), **datastore_settings(m, shell)}
            settings.update({f"{m}.{k}": v for k, v in extra.items() if k != "draft_vocab"})
    return prompt_file, ck_root, settings


def check_compare(rep: Report, tg: Targets, methods: list[str], n: int, tokens: int, budget: int,
                  out_dir: Path) -> None:
    """`compare` (harness/runs/executor.run_grid, the CLI's path) over the small Llama target and every
    method's random weights saved as checkpoints, in float16, on a prompt file made here; then the
    tables and plots (harness/report/run_readme.write_report)."""
    from rich.console import Console

    from harness.report.run_readme import write_report
    from harness.runs.config import RunConfig
    from harness.runs.executor import run_grid
    from harness.runs.metrics import attach_divergences
    from harness.runs.results import RunDir

    name, dtype = "llama-small", torch.float16
    with rep.unit("compare", name, dtype, "all"):
        out_dir = out_dir.resolve()
        shutil.rmtree(out_dir, ignore_errors=True)  # this script's own output: a new run each time
        prompt_file, ck_root, settings = compare_inputs(tg, name, methods, n, budget)
        # The target by its path relative to the scratch folder: checkpoints are looked for under
        # $SPECBENCH_CHECKPOINTS/<target name>/<method>.
        spec = RunConfig(methods=methods, benchmarks=["gpu_check"], target=str(tg.folder(name).relative_to(tg.work)),
                         dtype="float16", device=str(tg.device), limit=None, max_new_tokens=tokens, settings=settings,
                         prompt_files={"gpu_check": {"path": str(prompt_file),
                                                     "sha256": hashlib.sha256(prompt_file.read_bytes()).hexdigest()}})
        cwd = os.getcwd()
        os.environ["SPECBENCH_CHECKPOINTS"] = str(ck_root)
        try:
            os.chdir(tg.work)
            run = run_grid(spec, out_dir, None, Console(file=io.StringIO()), command="compare")
            files = write_report(Path(run))
        finally:
            os.chdir(cwd)
            os.environ.pop("SPECBENCH_CHECKPOINTS", None)
        records = attach_divergences(RunDir(run).read_records())
        per = {m: [r for r in records if r.method == m] for m in ["ar", *methods]}
        missing = [m for m, rs in per.items() if len(rs) != n]
        wide = sorted({m for m in methods for r in per[m] if r.divergence and not r.divergence["near_tie"]})
        tables = [p for p in files if p.suffix == ".md" and "tables" in p.parts]
        plots = [p for p in files if p.suffix == ".png"]
        ok = not missing and not wide and bool(tables) and bool(plots)
        detail = (f"{len(records)} answers, {len(tables)} markdown tables, {len(plots)} plots in {out_dir}"
                  + (f"; missing answers for {missing}" if missing else "")
                  + (f"; not near ties: {wide}" if wide else ""))
        rep.add("compare", name, dtype, "all", ok, detail, run_dir=str(out_dir), files=[str(p) for p in files])
        if tables:
            rep.extra["compare_table"] = tables[0].read_text()


def check_official(rep: Report, tg: Targets, n: int, tokens: int, budget: int) -> None:
    """The released layouts (harness/testing/hub_layouts.py) load onto a hub-format Vicuna-shaped target on the
    device; greedy answers exact in float32, near ties in float16 (the Vicuna papers' dtype)."""
    cfg = vicuna_like()
    folder = write_hub_target(tg.work / "targets" / "vicuna-like", cfg, seed=7)
    layouts = [m for m in ("medusa", "hydra", "eagle", "eagle2", "eagle3", "gumiho")
               if (m == "eagle2" or m in OFFICIAL_LAYOUTS) and m in builtin_methods()]
    for dtype in (torch.float32, torch.float16):
        with rep.unit("official", "vicuna-like", dtype, "load"):
            target = Target.load(str(folder), str(tg.device), str(dtype).replace("torch.", ""))
            prompts = make_prompts(cfg.vocab_size, n, seed=6)
            ars = [generate(target, p, GenerationConfig(tokens, record_logit_gaps=True)) for p in prompts]
            for m in layouts:
                with rep.unit("official", "vicuna-like", dtype, m):
                    from methods.registry import get_method

                    ck = write_official(m, tg.work / "official" / m, cfg)
                    extra = {"total_tokens": budget + 1} if m in ("eagle2", "eagle3", "gumiho") else {}
                    d = get_method(m).from_pretrained(ck, target, extra)
                    divs = [first_divergence(generate(target, p, GenerationConfig(tokens), d).output_ids,
                                             ar.output_ids, ar.top1, ar.gap, False) for p, ar in zip(prompts, ars)]
                    bad = [x for x in divs if x is not None and (dtype == torch.float32 or not x["near_tie"])]
                    ties = sum(x is not None for x in divs) - len(bad)
                    detail = (f"loaded ({d.num_parameters()} parameters, {next(d.parameters()).dtype}); "
                              + (f"{len(bad)}/{n} answers leave AR (first at token {bad[0]['position']})" if bad
                                 else f"{n} answers identical to AR" + (f" up to {ties} near ties" if ties else "")))
                    rep.add("official", "vicuna-like", dtype, m, not bad, detail, divergences=divs)
            del target


def check_imports(rep: Report) -> None:
    outside = dict(GUARDS.imports)
    rep.add("imports", "-", "-", "-", not outside and not GUARDS.reads,
            (f"imported beyond the allowed packages: {outside}; " if outside else "imports: stdlib + allowed only; ")
            + (f"read outside the code folders: {sorted(GUARDS.reads)}" if GUARDS.reads else
               "read nothing under checkpoints/, datasets/, results/ or ../shared"),
            outside=outside, reads=sorted(GUARDS.reads))


# ----------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:N or cpu")
    ap.add_argument("--quick", action="store_true", help="small targets and short answers only (CI: <= 2 min on one CPU core)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write every check to")
    ap.add_argument("--only", default=None, help="comma-separated sections to run (default all)")
    ap.add_argument("--keep", type=Path, default=None, help="make the scratch folder here and keep it")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda asked for, but torch sees no CUDA GPU: use --device cpu", file=sys.stderr)
        return 2
    plan = PLANS["quick" if args.quick else "full"]
    if args.only and not set(args.only.split(",")) <= set(SECTIONS):
        print(f"--only {args.only}: sections are {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    work = (args.keep or Path(tempfile.mkdtemp(prefix="gpu_check-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # Everything this run caches (cost curves, converted targets) stays in the scratch folder; no hub.
    os.environ.update({"SPECBENCH_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"})
    os.environ.pop("SPECBENCH_CHECKPOINTS", None)
    rep = Report(args)
    methods = builtin_methods()
    tg = Targets(work, device, args.quick)
    budget, answers = plan["budget"], plan["answers"]
    half_targets = ["llama-small"] if args.quick else tg.names()  # --quick: the Qwen2 shape runs float32 only
    compare_dir = (args.out.parent / f"{args.out.stem}-compare") if args.out else work / "compare"
    sections = {
        "exactness": lambda: check_exactness(rep, tg, methods, answers, budget),
        "near_ties": lambda: check_near_ties(rep, tg, half_targets, methods, answers, budget),
        # --quick: the rule's branches (static and dynamic point-mass trees, sampled q) with full samples
        "law": lambda: check_law(rep, tg, [m for m in methods if m in QUICK_LAW] if args.quick else methods,
                                 plan["law_samples"], budget),
        "cost_curve": lambda: check_cost_curve(rep, tg, *plan["curve"]),
        "ar_vs_hf": lambda: check_ar_vs_hf(rep, tg, *plan["ar_vs_hf"]),
        "compare": lambda: check_compare(rep, tg, methods, *plan["compare"], budget, compare_dir),
        "official": lambda: check_official(rep, tg, *plan["official"], budget),
    }
    only = args.only.split(",") if args.only else list(sections)
    print(f"gpu_check on {device} ({'quick' if args.quick else 'full'}), scratch {work}; methods: {', '.join(methods)}")
    for name in only:
        with rep.section(name):
            sections[name]()
    check_imports(rep)
    status = rep.write(args.out)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
