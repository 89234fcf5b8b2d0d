"""Hub-format folders made locally: a random-initialised target as `from_pretrained` reads it
(config.json, model.safetensors, a tokenizer) and drafter checkpoints in the official layouts of
Medusa, Hydra, EAGLE, EAGLE-3 and Gumiho (synthetic weights of the released key names and shapes,
shared/docs/checkpoints.md; the per-method builders are harness/testing/official_states.py). What the paper
recipe loads, checked without the hub: tests/test_paper_recipe.py and scripts/gpu_check.py.

The tokenizer is a word-level one over the target's whole vocabulary (`w0` ... `w{V-1}`, split on
spaces), so text prompts, chat templates and decoding all go through the real HF code paths.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from harness.testing.official_states import (eagle3_official_state, eagle_official_state, hydra_official_state,
                                             medusa_official_state)

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def make_tokenizer(vocab_size: int):
    """A fast tokenizer whose token `w{i}` is id i (unknown words map to w0); no special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def text_of(ids: list[int]) -> str:
    """The prompt text whose tokens are `ids` under `make_tokenizer`."""
    return " ".join(f"w{i}" for i in ids)


def random_model(config, seed: int, sharpen: float = 8.0):
    """A random-initialised causal LM of `config` (float32, CPU), its output sharpened so greedy text
    is not a run of near ties (the tied embedding of a Qwen2-shaped model is scaled with it)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


def write_hub_target(folder: Path, config, seed: int = 0, sharpen: float = 8.0) -> Path:
    """`folder` as a hub checkpoint of a random `config` model (`random_model`): config.json,
    model.safetensors, generation_config.json and the tokenizer files. Returns the folder."""
    folder = Path(folder)
    random_model(config, seed, sharpen).save_pretrained(folder)
    make_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def vicuna_like(vocab: int = 256, hidden: int = 64, layers: int = 7):
    """Vicuna-7B's shape at toy size: Llama, multi-head attention (kv heads = heads), SiLU MLP of
    11008/4096 the hidden size, rms eps 1e-6; 7 layers so EAGLE-3 has three distinct layers to read."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11008 // 4096,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-6,
                       max_position_embeddings=1024, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       tie_word_embeddings=False)


# ---- official drafter layouts -------------------------------------------------------------------
def _small(state: dict[str, torch.Tensor], scale: float = 0.05) -> dict[str, torch.Tensor]:
    """Matrices scaled to init size (the builders draw N(0, 1)), so half precision does not overflow."""
    return {k: (v * scale if v.is_floating_point() and v.dim() > 1 else v) for k, v in state.items()}


def _medusa(folder: Path, cfg) -> None:
    torch.save(_small(medusa_official_state(cfg.hidden_size, cfg.vocab_size)), folder / "medusa_lm_head.pt")
    # The released config.json: only medusa_num_layers is read (checkpoints.md §1.3).
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 5, "medusa_num_layers": 1}))


def _hydra(folder: Path, cfg) -> None:
    st = hydra_official_state(cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.num_attention_heads,
                              cfg.num_key_value_heads)
    torch.save(_small(st), folder / "hydra_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"hydra_num_heads": 4, "hydra_num_layers": 4,
                                                    "hydra_head_arch": "prefix-mlp", "grounded_heads": True}))


def _eagle(folder: Path, cfg) -> None:
    st = eagle_official_state(cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, bias=True, emb=True)  # the Vicuna-era file (fp32, embedding)
    torch.save(_small(st), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps}))


def _eagle3(folder: Path, cfg) -> None:
    vd = cfg.vocab_size // 4
    st = eagle3_official_state(cfg.hidden_size, cfg.vocab_size, vd, cfg.intermediate_size, cfg.num_attention_heads,
                        cfg.num_key_value_heads)
    torch.save(_small(st), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "vocab_size": cfg.vocab_size, "draft_vocab_size": vd}))


def _gumiho(folder: Path, cfg) -> None:
    """The file's keys (checkpoints.md §5.4): ours without the `stack.` prefix, plus the embedding."""
    from harness.core.target import Target
    from methods.registry import get_method

    shell = Target(random_model(cfg, 0), None, "shape-only", torch.device("cpu"), torch.float32)
    ours = get_method("gumiho")(shell, {"draft_vocab": 0}).state_dict()
    st = {k.replace("stack.", "", 1): torch.randn_like(v) for k, v in ours.items()}
    st["embed_tokens.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size)
    torch.save(_small(st), folder / "pytorch_model.bin")


OFFICIAL_LAYOUTS: dict[str, Callable[[Path, object], None]] = {
    "medusa": _medusa, "hydra": _hydra, "eagle": _eagle, "eagle3": _eagle3, "gumiho": _gumiho}


def write_official(method: str, folder: Path, target_config, seed: int = 0) -> Path:
    """`folder` holding a synthetic checkpoint of `method` in its released layout for a target of
    `target_config` (EAGLE-2 reads EAGLE's). Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    OFFICIAL_LAYOUTS["eagle" if method == "eagle2" else method](folder, target_config)
    return folder
