"""A "base model view" of a target: the folder the official implementations load as their base
model, in the form their older transformers (4.37.1, 4.50.1) read correctly.

A folder written by transformers 5 is misread there without a word: its config keeps the RoPE
base in `rope_parameters`, which 4.50 does not know, so SmolLM2's 100,000 silently becomes the
default 10,000; its tokenizer class (`TokenizersBackend`) does not exist there. The view writes:
  config.json                   the source's, with `rope_theta` (and `rope_scaling`) written out
                                and `dtype` as `torch_dtype`;
  model.safetensors (+ shards)  the source's weights, hard-linked where the filesystem allows;
  model.safetensors.index.json  also for a single file: EAGLE's drafts read the base embedding
                                through it (SafeAILab/EAGLE eagle/model/cnets.py:489-497);
  tokenizer.json                with BPE merges as "a b" strings, which tokenizers 0.15 (under
                                4.37) parses too;
  tokenizer_config.json, special_tokens_map.json
                                naming PreTrainedTokenizerFast, which every version reads from
                                tokenizer.json alone, with the special tokens and chat template.
No torch import: the peer runner imports this module in any environment.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from harness.core.errors import SpecbenchError

TOKENIZER_CLASS = "PreTrainedTokenizerFast"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
# tokenizer_config.json fields the older versions read as they are (the rest is transformers 5's own).
TOKENIZER_FIELDS = (*SPECIAL_TOKENS, "model_max_length", "clean_up_tokenization_spaces", "add_bos_token",
                    "add_eos_token", "added_tokens_decoder", "chat_template")
INDEX = "model.safetensors.index.json"


def legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 config.json as 4.37 / 4.50 read it: `rope_parameters` becomes `rope_theta`
    (written even at its default, which those versions would otherwise assume) and `rope_scaling`;
    `dtype` becomes `torch_dtype`. Their Llama layers take head_dim = hidden / heads."""
    out = {k: v for k, v in config.items() if k not in ("rope_parameters", "dtype")}
    rope = dict(config.get("rope_parameters") or {})
    out["rope_theta"] = float(rope.pop("rope_theta", config.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    out["rope_scaling"] = None if kind == "default" else {**rope, "type": kind, "rope_type": kind}
    if "dtype" in config:
        out["torch_dtype"] = config["dtype"]
    heads, hidden, head_dim = config.get("num_attention_heads"), config.get("hidden_size"), config.get("head_dim")
    if head_dim is not None and heads and hidden and head_dim * heads != hidden:
        raise SpecbenchError(f"the target's head_dim {head_dim} is not hidden {hidden} / {heads} heads: transformers "
                             "4.37's Llama cannot read it, so no base view can be written for it")
    return out


def safetensors_names(file: Path) -> list[str]:
    """Tensor names in a .safetensors file, read from its JSON header (no torch)."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return [k for k in header if k != "__metadata__"]


def link_or_copy(src: Path, dest: Path) -> None:
    """A hard link to `src` (a view costs no space), or a copy across filesystems."""
    if dest.exists():
        dest.unlink()
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def write_weights(source: Path, out: Path) -> list[str]:
    """The source's safetensors (a single file or shards with their index) and an index either way;
    returns the tensor names."""
    index = source / INDEX
    if index.exists():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        for shard in sorted(set(weight_map.values())):
            link_or_copy(source / shard, out / shard)
        shutil.copyfile(index, out / INDEX)
        return list(weight_map)
    single = source / "model.safetensors"
    if not single.exists():
        raise SpecbenchError(f"{source} holds no model.safetensors (nor a sharded index): a base view needs "
                             "safetensors weights; load and save the model with transformers first")
    link_or_copy(single, out / single.name)
    names = safetensors_names(single)
    total = single.stat().st_size
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                         "weight_map": {n: single.name for n in names}}, indent=2) + "\n")
    return names


def legacy_tokenizer(data: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer.json as tokenizers 0.15 (under transformers 4.37) parses it: BPE merges as
    "a b" strings (newer versions write [a, b] pairs, which it cannot read); newer versions read
    both. A model it would read differently (merges with a space, ignore_merges) is refused."""
    model = data.get("model") or {}
    merges = model.get("merges") or []
    if merges and isinstance(merges[0], list):
        if any(" " in part for pair in merges for part in pair):
            raise SpecbenchError("the tokenizer has BPE merges with a space in a token: tokenizers 0.15 cannot "
                                 "hold them, so no base view can be written for it")
        model["merges"] = [" ".join(pair) for pair in merges]
    if model.get("ignore_merges"):
        raise SpecbenchError("the tokenizer sets ignore_merges, which tokenizers 0.15 would silently ignore: "
                             "no base view can be written for it")
    return data


def write_tokenizer(source: Path, out: Path) -> None:
    """tokenizer.json in its legacy form; tokenizer_config.json naming PreTrainedTokenizerFast with the
    source's special tokens and chat template (transformers 5 keeps it in chat_template.jinja)."""
    if not (source / "tokenizer.json").exists():
        raise SpecbenchError(f"{source} has no tokenizer.json: the base view needs a fast tokenizer's file")
    data = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    (out / "tokenizer.json").write_text(json.dumps(legacy_tokenizer(data), ensure_ascii=False), encoding="utf-8")
    src_cfg = source / "tokenizer_config.json"
    cfg = json.loads(src_cfg.read_text(encoding="utf-8")) if src_cfg.exists() else {}
    view = {k: cfg[k] for k in TOKENIZER_FIELDS if k in cfg}
    template = source / "chat_template.jinja"
    if "chat_template" not in view and template.exists():
        view["chat_template"] = template.read_text(encoding="utf-8")
    view["tokenizer_class"] = TOKENIZER_CLASS
    (out / "tokenizer_config.json").write_text(json.dumps(view, indent=2) + "\n", encoding="utf-8")
    special = {k: cfg[k] for k in SPECIAL_TOKENS if isinstance(cfg.get(k), (str, dict))}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


def write_base_view(source: str | Path, out: str | Path) -> Path:
    """Write the base view of the Hugging Face folder `source` into `out` (see the module's doc);
    returns `out`. `base_folder` finds the folder of a target spec."""
    source, out = Path(source), Path(out)
    if not (source / "config.json").exists():
        raise SpecbenchError(f"{source} is not a Hugging Face model folder (no config.json)")
    config = legacy_config(json.loads((source / "config.json").read_text(encoding="utf-8")))
    out.mkdir(parents=True, exist_ok=True)
    write_weights(source, out)
    write_tokenizer(source, out)
    if (source / "generation_config.json").exists():
        shutil.copyfile(source / "generation_config.json", out / "generation_config.json")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def base_folder(target: str) -> Path:
    """The Hugging Face folder of a target spec (an alias's dequantised copy is made once: this
    imports torch and transformers, the writer above does not)."""
    from harness.core.target import hf_folder

    return hf_folder(target)
