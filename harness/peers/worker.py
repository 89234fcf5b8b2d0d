"""Run one official implementation (a peer) on pre-tokenized prompts, inside the peer's own
virtual environment (scripts/setup_peers.sh): `python -m harness.peers.worker JOB.json`.

This module is the only project code that runs there, so it imports the standard library, torch,
the peer's own modules and, of specbench, only the one clock (harness/core/timing.py: stdlib and
torch alone), so a peer's wall time is read the way ours is. It puts the peer's folder on sys.path,
shims what the peer needs a GPU or an unused dependency for (below), builds the peer's model the
way the peer's own runner script does, and calls the peer's own forward function for each prompt
(Spec-Bench's `evaluation/inference_*.py:*_forward`, EAGLE's `eagenerate`, ...). One JSON line per
answer is appended to the job's output file as it finishes; answers already there are skipped,
so a killed worker resumes.

JOB.json: {"adapter": name in ADAPTERS (or "module:function", see `adapter`), "peer_dir": folder,
"base": target folder in the layout the peer's transformers reads, "drafter": folder of the
drafter weights in the official layout or null, "settings": the peer's own knobs, "dtype":
"float32" | "bfloat16", "threads": n, for a retrieval peer "datastore_tokens" (our datastore's
tokens.npy) and "datastore_index" (where its own index of them is written once),
"shims": {name in SHIMS: [peer modules]}, "prompts": [{"key", "ids", "max_new_tokens", "temperature"}],
"out": results .jsonl}
A result line: {"key", "output_ids", "accept_lengths" (new tokens per verify step, the peer's own
count), "prefill_step" (whether the peer's first step is its prefill: transformers-style loops
feed the prompt with the first drafts, EAGLE's code prefills apart), "wall_s"}.
"""
from __future__ import annotations

import copy
import functools
import importlib
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

from harness.core.timing import Clock

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


def rope_theta_shim(modules: list[str], job: dict) -> None:
    """Several peers' Llama attention builds its rotary embedding with the default base 10,000 and
    never reads the config's `rope_theta` (Spec-Bench's model/{eagle,medusa,hydra}/
    modeling_llama_kv.py:495-499 and model/eagle/cnets.py:215-216, the Hydra repository's
    hydra/model/modeling_llama_kv.py:495-499): on a target with another base (SmolLM2: 100,000)
    they compute another model. After the peer's own `_init_rope` in each of `modules`, the
    default rotary embedding is rebuilt with the config's base; RoPE scaling is left alone."""
    for name in modules:
        module = importlib.import_module(name)
        for cls in list(vars(module).values()):
            if isinstance(cls, type) and "_init_rope" in vars(cls) and not getattr(cls._init_rope, "shimmed", False):
                cls._init_rope = _with_config_rope(cls._init_rope)


def _with_config_rope(init_rope: Callable) -> Callable:
    def _init_rope(self) -> None:
        init_rope(self)
        theta, rotary = getattr(self.config, "rope_theta", None), self.rotary_emb
        if theta is None or getattr(self.config, "rope_scaling", None) is not None or float(rotary.base) == float(theta):
            return
        self.rotary_emb = type(rotary)(rotary.dim, max_position_embeddings=rotary.max_position_embeddings,
                                       base=float(theta), device=rotary.inv_freq.device)
    _init_rope.shimmed = True
    return _init_rope


def gumiho_fp32_shim(modules: list[str], job: dict) -> None:
    """Gumiho's draft forces float16 on its MLP heads: `compile_mlp` casts them to float16 and
    torch.compiles them (gumiho/model/cnets.py:597-608), and `topK_genrate` casts their outputs
    with `.half()` before the base LM head (cnets.py:815, 862). In a float32 run that would mix
    dtypes (and compile for minutes on a CPU): `compile_mlp` is skipped and `.half()` keeps the
    run's dtype, so the draft computes what it computes in float16, in float32."""
    dtype = _dtype(job)
    for name in modules:
        module = importlib.import_module(name)
        module.Model.compile_mlp = lambda self: None
    torch.Tensor.half = lambda self, *a, **k: self.to(dtype)


class _KeyValueHeads:
    """A model as a KV-cache allocator that sizes by query heads should see it: `config` with the
    key/value heads as its heads (and hidden size = those heads x head_dim), device and dtype kept."""

    def __init__(self, model) -> None:
        config = copy.copy(model.config)
        head_dim = config.hidden_size // config.num_attention_heads
        config.num_attention_heads = config.num_key_value_heads
        config.hidden_size = head_dim * config.num_key_value_heads
        self.config, self.device, self.dtype = config, model.device, model.dtype


def kv_heads_shim(modules: list[str], job: dict) -> None:
    """Spec-Bench's Medusa and Hydra (model/medusa/kv_cache.py:93, model/hydra/kv_cache.py:110)
    and the Hydra repository (hydra/model/kv_cache.py:110) allocate their KV cache with one slot per
    query head, while their attention writes one per key/value head: on a grouped-query target
    (SmolLM2: 9 query, 3 key/value heads) the first write fails. `initialize_past_key_values` of
    each of `modules` (imported before the peer's modules import it by name) is given the model
    with its key/value heads as its heads, so it allocates what the attention writes."""
    for name in modules:
        module = importlib.import_module(name)
        inner = module.initialize_past_key_values

        @functools.wraps(inner)
        def allocate(model, *args, _inner=inner, **kwargs):
            return _inner(_KeyValueHeads(model), *args, **kwargs)
        module.initialize_past_key_values = allocate


class _CpuTorch(types.ModuleType):
    """torch as a peer module that builds tensors on `torch.device('cuda:0')` should see it on the
    CPU: `device(...)` is the CPU, every other name is torch's own."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.device = lambda *a, **k: torch.device("cpu")

    def __getattr__(self, name: str):
        return getattr(torch, name)


def cuda_device_shim(modules: list[str], job: dict) -> None:
    """Spec-Bench's Token Recycling runner builds its tree buffers with
    `device=torch.device('cuda:0')` (evaluation/inference_recycling.py:80-82, 95, 101): each of
    `modules` (imported here, FastChat's stand-in first) reads `torch` through a view whose
    `device` is the CPU; the peer's tensors and arithmetic are torch's own."""
    fastchat_shim()
    for name in modules:
        importlib.import_module(name).torch = _CpuTorch()


# name -> shim(modules, job); the catalog (harness/peers/catalog.py) says which peer takes which.
SHIMS: dict[str, Callable[[list[str], dict], None]] = {"rope_theta": rope_theta_shim, "kv_heads": kv_heads_shim,
                                                       "gumiho_fp32": gumiho_fp32_shim, "cuda_device": cuda_device_shim}


class StepCounter:
    """New tokens per verify step of a peer loop that does not return them (EAGLE's `eagenerate`,
    FasterDecoding's `medusa_generate`, ...): wraps the loop's `update_inference_inputs` in the
    peer module that calls it (looked up there by name at every call, so no peer file is edited);
    each call's appended ids are one step. `ids` is the sequence after the last step."""

    def __init__(self, module, name: str = "update_inference_inputs") -> None:
        self.steps: list[int] = []
        self.ids: torch.Tensor | None = None
        inner = getattr(module, name)

        def counted(input_ids, *args, **kwargs):
            out = inner(input_ids, *args, **kwargs)
            self.steps.append(int(out[0].shape[1] - input_ids.shape[1]))
            self.ids = out[0]
            return out
        setattr(module, name, counted)

    def reset(self) -> None:
        self.steps, self.ids = [], None

    def run_stream(self, stream, max_new_tokens: int) -> None:
        """Drive a generator loop (one yield per step, no token limit of its own) until it has
        made `max_new_tokens` or stopped at EOS."""
        for _ in stream:
            if sum(self.steps) >= max_new_tokens:
                stream.close()
                break


class Inputs:
    """What Spec-Bench's forward functions take: a tokenizer's output, `input_ids` [1, P]."""

    def __init__(self, ids: list[int]) -> None:
        self.input_ids = torch.tensor([ids])
        self.attention_mask = torch.ones_like(self.input_ids)


def new_tokens(output, prompt_len: int) -> list[int]:
    """The new ids of row 0 of `output` ([1, P + n] tensor or list of lists)."""
    return [int(t) for t in list(output[0])[prompt_len:]]


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


def spec_bench_dynamic_tree(version: str) -> Callable[[dict], Generate]:
    """Spec-Bench's EAGLE-2 or EAGLE-3 (`inference_eagle{2,3}.py`: model/eagle{2,3}/ea_model.py
    EaModel.eagenerate with total_token/depth/top_k; EAGLE-3's loader picks its draft by use_eagle3,
    True by default)."""
    def build(job: dict) -> Generate:
        fastchat_shim()
        ea = importlib.import_module(f"model.{version}.ea_model")
        runner = importlib.import_module(f"evaluation.inference_{version}")
        s = job["settings"]
        model = ea.EaModel.from_pretrained(base_model_path=job["base"], ea_model_path=job["drafter"],
                                           total_token=s["total_token"], depth=s["depth"], top_k=s["top_k"],
                                           torch_dtype=_dtype(job)).eval()

        def generate(ids, max_new_tokens, temperature):
            out, _new, _steps, acc = runner.ea_forward(Inputs(ids), model, model.get_tokenizer(), max_new_tokens,
                                                       temperature=temperature)
            return new_tokens(out, len(ids)), acc
        return generate
    return build


def spec_bench_eagle(job: dict) -> Generate:
    """Spec-Bench's EAGLE-1 (`inference_eagle.py`: ea_forward over its static tree, here the runner's
    default mc_sim_7b_63 of model/eagle/choices.py; the draft's top-k is cnets.py's module-level 10)."""
    fastchat_shim()
    ea = importlib.import_module("model.eagle.ea_model")
    utils = importlib.import_module("model.eagle.utils")
    choices = importlib.import_module("model.eagle.choices")
    runner = importlib.import_module("evaluation.inference_eagle")
    model = ea.EaModel.from_pretrained(base_model_path=job["base"], ea_model_path=job["drafter"],
                                       torch_dtype=_dtype(job)).eval()
    tree = getattr(choices, job["settings"]["tree_choices"])

    def generate(ids, max_new_tokens, temperature):
        processor = utils.prepare_logits_processor(temperature=temperature) if temperature > 1e-5 else None
        out, _new, _steps, acc = runner.ea_forward(Inputs(ids), model, model.get_tokenizer(), max_new_tokens,
                                                   tree_choices=tree, logits_processor=processor)
        return new_tokens(out, len(ids)), acc
    return generate


def spec_bench_medusa(job: dict) -> Generate:
    """Spec-Bench's Medusa (`inference_medusa.py`: medusa_forward, 4 heads hard-coded at L200, the
    Medusa mc_sim_7b_63 choices)."""
    fastchat_shim()
    medusa = importlib.import_module("model.medusa.medusa_model")
    choices = importlib.import_module("model.medusa.medusa_choices")
    runner = importlib.import_module("evaluation.inference_medusa")
    s = job["settings"]
    model = medusa.MedusaModel.from_pretrained(job["drafter"], job["base"], medusa_num_heads=s["medusa_num_heads"],
                                               torch_dtype=_dtype(job)).eval()
    tree = getattr(choices, s["medusa_choices"])

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.medusa_forward(Inputs(ids), model, model.get_tokenizer(), max_new_tokens,
                                                       medusa_choices=tree, temperature=temperature)
        return new_tokens(out, len(ids)), acc
    return generate


def spec_bench_hydra(job: dict) -> Generate:
    """Spec-Bench's Hydra (`inference_hydra.py`: hydra_forward, the mc_sim_7b_63 choices)."""
    fastchat_shim()
    hydra = importlib.import_module("model.hydra.hydra_model")
    choices = importlib.import_module("model.hydra.hydra_choices")
    runner = importlib.import_module("evaluation.inference_hydra")
    model = hydra.HydraModel.from_pretrained(job["drafter"], job["base"], torch_dtype=_dtype(job)).eval()
    tree = getattr(choices, job["settings"]["hydra_choices"])

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.hydra_forward(Inputs(ids), model, model.get_tokenizer(), max_new_tokens,
                                                      hydra_choices=tree, temperature=temperature)
        return new_tokens(out, len(ids)), acc
    return generate


def spec_bench_lookahead(job: dict) -> Generate:
    """Spec-Bench's Lookahead (`inference_lookahead.py` with USE_LADE=1: model/lade's
    `augment_all` patches transformers' greedy search, `config_lade` sets level/window/guess;
    `lookahead_forward` calls `generate`, which returns the ids and its per-step counts)."""
    import os

    fastchat_shim()
    from transformers import AutoModelForCausalLM

    os.environ["USE_LADE"], os.environ["CHAT"] = "1", "0"
    lade = importlib.import_module("model.lade.utils")
    lade.augment_all()
    s = job["settings"]
    lade.config_lade(LEVEL=s["level"], WINDOW_SIZE=s["window"], GUESS_SET_SIZE=s["guess"], DEBUG=0, USE_FLASH=0,
                     DIST_WORKERS=1)
    runner = importlib.import_module("evaluation.inference_lookahead")
    model = AutoModelForCausalLM.from_pretrained(job["base"], torch_dtype=_dtype(job)).eval()
    tokenizer = _tokenizer(job)

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.lookahead_forward(Inputs(ids), model, tokenizer, max_new_tokens)
        return new_tokens(out, len(ids)), acc
    return generate


def spec_bench_recycling(job: dict) -> Generate:
    """Spec-Bench's Token Recycling (`inference_recycling.py`: recycling_forward over the module's
    `adj_matrix`, template `tree_version`, top-`output_id_topk` rows). The runner's `__main__` makes
    one zero matrix for the whole benchmark; here each answer gets a new zero matrix (settings
    `adjacency: per answer`), so an answer does not depend on which ran before it in this
    process. Its loop stops on an EOS bonus without appending it (L135-137): an answer that
    stops short of the limit gets that EOS back, so it is cut where ours is."""
    fastchat_shim()
    runner = importlib.import_module("evaluation.inference_recycling")
    llama = importlib.import_module("model.recycling.modeling_llama_kv")
    s = job["settings"]
    model = llama.LlamaForCausalLM.from_pretrained(job["base"], torch_dtype=_dtype(job)).eval()
    tokenizer = _tokenizer(job)

    def generate(ids, max_new_tokens, temperature):
        runner.adj_matrix = torch.zeros((model.vocab_size, s["output_id_topk"]), dtype=torch.long)
        out, _new, _steps, acc = runner.recycling_forward(Inputs(ids), model, tokenizer, max_new_tokens,
                                                          output_id_topk=s["output_id_topk"],
                                                          tree_version=s["tree_version"])
        tokens = new_tokens(out, len(ids))
        if len(tokens) < max_new_tokens and (not tokens or tokens[-1] != tokenizer.eos_token_id):
            tokens.append(tokenizer.eos_token_id)
        return tokens, acc
    return generate


def spec_bench_samd(job: dict) -> Generate:
    """Spec-Bench's SAM-Decoding (`inference_samd.py`: SamdModel over the target loaded as its
    `__main__` loads it, a DraftModel with its `samd_*` settings, `tree_method` and the static
    automaton as the settings say (the runner's defaults: none, so the dynamic automaton alone))."""
    fastchat_shim()
    from transformers import AutoModelForCausalLM

    samd = importlib.import_module("model.samd")
    runner = importlib.import_module("evaluation.inference_samd")
    s, dtype = job["settings"], _dtype(job)
    model = AutoModelForCausalLM.from_pretrained(job["base"], torch_dtype=dtype, device_map="cpu",
                                                 attn_implementation=s["attn_implementation"]).eval()
    tokenizer = _tokenizer(job)
    device = next(model.lm_head.parameters()).device
    config = samd.SamdConfig(n_predicts=s["samd_n_predicts"], tree_method=s["tree_method"], tree_model_path=None,
                             len_threshold=s["samd_len_threshold"], len_bias=s["samd_len_bias"], tree_path=None)
    draft = samd.DraftModel(config, sam_static=None, lm=model, dtype=dtype, device=device)
    model = samd.SamdModel(config, model, draft, tokenizer.eos_token_id, dtype, device)

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.samd_forward(Inputs(ids), model, tokenizer, max_new_tokens,
                                                     temperature=temperature, do_sample=temperature > 0)
        return new_tokens(out, len(ids)), acc
    return generate


def retriever_index(tokens_file: str, index_file: str, vocab_size: int) -> str:
    """REST's datastore in its own format (a DraftRetriever index), written once from our datastore's
    tokens (tokens.npy, documents separated by -1): each document is one entry, as its
    `get_datastore_chat.py` adds one per conversation turn."""
    import numpy as np
    import draftretriever

    index = Path(index_file)
    if index.exists():
        return str(index)
    index.parent.mkdir(parents=True, exist_ok=True)
    tokens = np.load(tokens_file, allow_pickle=False)
    tmp = index.with_name(index.name + ".tmp")
    try:  # the vendored DraftRetriever's Writer (0.1.0); PyPI's 0.1.1 names the file `file_path` and has no chunk size
        writer = draftretriever.Writer(index_file_path=str(tmp), max_chunk_len=512 * 1024 * 1024, vocab_size=vocab_size)
    except TypeError:
        writer = draftretriever.Writer(file_path=str(tmp), vocab_size=vocab_size)
    for doc in np.split(tokens, np.flatnonzero(tokens < 0)):
        doc = doc[doc >= 0]
        if doc.size:
            writer.add_entry(doc.tolist())
    writer.finalize()
    tmp.replace(index)
    return str(index)


def spec_bench_rest(job: dict) -> Generate:
    """Spec-Bench's REST (`inference_rest.py`: rest_forward with RestModel, a DraftRetriever reader
    of the datastore, `num_draft` and spans `max_token_span`..2), greedy (top_p 0) at T = 0."""
    fastchat_shim()
    import draftretriever

    s = job["settings"]
    rest = importlib.import_module("model.rest.rest.model.rest_model")
    runner = importlib.import_module("evaluation.inference_rest")
    model = rest.RestModel.from_pretrained(job["base"], torch_dtype=_dtype(job)).eval()
    vocab = json.loads((Path(job["base"]) / "config.json").read_text())["vocab_size"]
    datastore = draftretriever.Reader(index_file_path=retriever_index(job["datastore_tokens"],
                                                                      job["datastore_index"], vocab))
    spans = list(range(2, s["max_token_span"] + 1))[::-1]

    def generate(ids, max_new_tokens, temperature):
        out, _new, _steps, acc = runner.rest_forward(Inputs(ids), model, model.get_tokenizer(), max_new_tokens,
                                                     temperature=temperature, top_p=0.0, datastore=datastore,
                                                     num_draft=s["num_draft"], token_spans=spans)
        return new_tokens(out, len(ids)), acc
    return generate


def _eagle_model(job: dict):
    ea = importlib.import_module("eagle.model.ea_model")
    s = job["settings"]
    model = ea.EaModel.from_pretrained(use_eagle3=bool(s.get("use_eagle3")), base_model_path=job["base"],
                                       ea_model_path=job["drafter"], total_token=s.get("total_token", 60),
                                       depth=s.get("depth", 5), top_k=s.get("top_k", 10),
                                       torch_dtype=_dtype(job)).eval()
    return ea, model


def counted(module, loop: Callable, stream: bool = False) -> Generate:
    """generate() over a peer loop that returns no per-step counts, `loop(ids [1, P], max_new_tokens,
    T)`: a `StepCounter` on `module` (the module whose globals the loop calls through) reads them.
    `stream`: the loop is a generator with no token limit (one yield per step), stopped at the limit."""
    counter = StepCounter(module)

    def generate(ids, max_new_tokens, temperature):
        counter.reset()
        out = loop(torch.tensor([ids]), max_new_tokens, temperature)
        if stream:
            counter.run_stream(out, max_new_tokens)
            out = counter.ids
        return new_tokens(out, len(ids)), list(counter.steps)
    return generate


def naive(model) -> Generate:
    """generate() over a peer's own plain decoding loop (`naivegenerate`, EAGLE's and Gumiho's speed baseline)."""
    def generate(ids, max_new_tokens, temperature):
        out = model.naivegenerate(torch.tensor([ids]), temperature=temperature, max_new_tokens=max_new_tokens)
        tokens = new_tokens(out, len(ids))
        return tokens, [1] * len(tokens)
    return generate


def eagle_eagenerate(job: dict) -> Generate:
    """The EAGLE authors' current code (`eagle/model/ea_model.py`: EaModel.eagenerate; EAGLE-2 with
    cnets1, EAGLE-3 with cnets as `use_eagle3` says; total_token/depth/top_k as its evaluation
    scripts set them)."""
    ea, model = _eagle_model(job)
    return counted(ea, lambda ids, n, t: model.eagenerate(ids, temperature=t, max_new_tokens=n))


def eagle_naive_ar(job: dict) -> Generate:
    return naive(_eagle_model(job)[1])


def medusa_generate(job: dict) -> Generate:
    """FasterDecoding's Medusa (`medusa/model/medusa_model.py`: medusa_generate, the streaming loop
    its CLI runs; its loader builds 5 heads whatever the config says, L143)."""
    medusa = importlib.import_module("medusa.model.medusa_model")
    choices = importlib.import_module("medusa.model.medusa_choices")
    model = medusa.MedusaModel.from_pretrained(job["drafter"], torch_dtype=_dtype(job)).eval()
    tree = getattr(choices, job["settings"]["medusa_choices"])
    return counted(medusa, lambda ids, n, t: model.medusa_generate(ids, temperature=t, medusa_choices=tree), True)


def hydra_generate(job: dict) -> Generate:
    """The Hydra repository's Hydra++ (`hydra/model/hydra_model.py`: hydra_generate, the streaming
    loop its CLI runs, with the mc_sim_7b_63 choices)."""
    hydra = importlib.import_module("hydra.model.hydra_model")
    choices = importlib.import_module("hydra.model.hydra_choices")
    model = hydra.HydraModel.from_pretrained(job["drafter"], job["base"], torch_dtype=_dtype(job)).eval()
    tree = getattr(choices, job["settings"]["hydra_choices"])
    return counted(hydra, lambda ids, n, t: model.hydra_generate(ids, temperature=t, hydra_choices=tree), True)


def _gumiho_model(job: dict):
    """The Gumiho repository's model, built as its `GumihoModel.from_pretrained` builds it
    (gumiho/model/gumiho_model.py:95-147) but for the draft config: that loader picks a repository
    file by `--model_name` (L118-133), which knows only its seven targets, so ours (the exported
    config.json) is passed to the peer's own constructor. `args` holds its evaluation scripts'
    settings (argparse's names)."""
    from types import SimpleNamespace

    gm = importlib.import_module("gumiho.model.gumiho_model")
    s = job["settings"]
    base = gm.KVLlamaForCausalLM.from_pretrained(job["base"], torch_dtype=_dtype(job))
    state = torch.load(str(Path(job["drafter"]) / "pytorch_model.bin"), map_location="cpu")
    model = gm.GumihoModel(base, job["base"], str(Path(job["drafter"]) / "config.json"), s["total_tokens"],
                           s["depth"], s["top_k"], 1.0, state, SimpleNamespace(**s)).eval()
    return gm, model


def gumiho_generate(job: dict) -> Generate:
    """The Gumiho repository's Gumiho (`gumihoGenerate`; FTA on or off as `complete_mask` says)."""
    gm, model = _gumiho_model(job)
    return counted(gm, lambda ids, n, t: model.gumihoGenerate(ids, temperature=t, max_new_tokens=n))


def gumiho_naive_ar(job: dict) -> Generate:
    return naive(_gumiho_model(job)[1])


def hf_ar(job: dict) -> Generate:
    """Plain decoding with the environment's transformers (`generate`), for peers without a loop of
    their own (FasterDecoding's Medusa, the Hydra repository)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job["base"], torch_dtype=_dtype(job)).eval()

    def generate(ids, max_new_tokens, temperature):
        sample = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, **sample)
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
    "spec-bench/eagle": (spec_bench_eagle, False),
    "spec-bench/eagle2": (spec_bench_dynamic_tree("eagle2"), False),
    "spec-bench/eagle3": (spec_bench_dynamic_tree("eagle3"), False),
    "spec-bench/medusa": (spec_bench_medusa, False),
    "spec-bench/hydra": (spec_bench_hydra, False),
    "spec-bench/lookahead": (spec_bench_lookahead, True),
    "spec-bench/recycling": (spec_bench_recycling, True),
    "spec-bench/samd": (spec_bench_samd, False),
    "spec-bench/rest": (spec_bench_rest, False),
    "eagle/eagle": (eagle_eagenerate, False),
    "eagle/ar": (eagle_naive_ar, True),
    "medusa/medusa": (medusa_generate, False),
    "hydra/hydra": (hydra_generate, False),
    "gumiho/gumiho": (gumiho_generate, False),
    "gumiho/ar": (gumiho_naive_ar, True),
    "hf/ar": (hf_ar, True),
}


def adapter(name: str) -> tuple[Callable[[dict], Generate], bool]:
    """ADAPTERS[name]; or, for "module:function", a builder the peer folder brings itself (imported
    from there, its `prefill_step` attribute saying what the ADAPTERS flag says, default False)."""
    if ":" not in name:
        return ADAPTERS[name]
    module, function = name.split(":", 1)
    build = getattr(importlib.import_module(module), function)
    return build, bool(getattr(build, "prefill_step", False))


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
    for name, modules in (job.get("shims") or {}).items():
        SHIMS[name](list(modules), job)
    build, prefill_step = adapter(job["adapter"])
    generate = build(job)
    out = Path(job["out"])
    done = done_keys(out)
    clock = Clock()  # the peers run on the CPU here (cpu_shims): no device to wait for
    # Without gradients, as the peers' own evaluation loops decode (inference mode there; here no_grad,
    # since inference-mode tensors would refuse the in-place cache updates of a later call).
    with torch.no_grad():
        generate(job["prompts"][0]["ids"], 8, 0.0)  # warm-up: first-call allocations are not the method's
    for p in job["prompts"]:
        if p["key"] in done:
            continue
        if p.get("seed") is not None:
            torch.manual_seed(int(p["seed"]))
        start = clock.now()
        with torch.no_grad():
            output_ids, accept = generate(p["ids"], int(p["max_new_tokens"]), float(p["temperature"]))
        wall = clock.now() - start
        with out.open("a") as f:
            f.write(json.dumps({"key": p["key"], "output_ids": [int(t) for t in output_ids],
                                "accept_lengths": [int(a) for a in accept], "prefill_step": prefill_step,
                                "wall_s": round(wall, 4)}) + "\n")
        print(json.dumps({"done": p["key"], "tokens": len(output_ids)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(json.loads(Path(sys.argv[1]).read_text())))
