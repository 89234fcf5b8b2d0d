"""A target sharded over several GPUs (`--device-map auto`, accelerate), and where the drafter goes.

A model too big for one GPU (the papers' LLaMA-70B rows) is split layer by layer over the GPUs
by accelerate's `infer_auto_device_map` (what `from_pretrained(device_map="auto")` does). Token
ids enter where the embedding lives; logits and the last hidden states come out where the LM
head lives. Drafters read those hidden states and reuse the LM head, so they sit on the LM head's
device, beside the target's last layer: no feature crosses a GPU boundary inside a draft step.
The plan is a pure function of the config and the memory per device, so it is tested on the meta
device without any GPU.
"""
from __future__ import annotations

from typing import Any

import torch

from harness.core.errors import SpecbenchError

DEVICE_MAPS = ("auto", "balanced", "sequential")  # accelerate's strategies, passed to from_pretrained


def check_device_map(device_map: str | None) -> None:
    """One line, before anything loads, for a strategy we do not know or a machine without GPUs."""
    if device_map is None:
        return
    if device_map not in DEVICE_MAPS:
        from harness.core.errors import unknown

        raise unknown("device map", device_map, DEVICE_MAPS)
    if not torch.cuda.is_available():
        raise SpecbenchError(f"--device-map {device_map} shards the target over GPUs, and torch sees none; "
                             "drop --device-map (one device) or run on a GPU machine")


def plan_device_map(config, dtype: torch.dtype, max_memory: dict[Any, int | str]) -> dict[str, Any]:
    """{module name: device} for a model of `config` given each device's memory budget (bytes or
    '40GiB'), as `from_pretrained(device_map="auto", max_memory=...)` would place it. Built on
    the meta device: nothing is allocated."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return infer_auto_device_map(model, max_memory=max_memory, dtype=dtype,
                                 no_split_module_classes=getattr(model, "_no_split_modules", None) or [])


def module_device(device_map: dict[str, Any], name: str) -> torch.device:
    """The device of module `name` under `device_map`: the entry of its longest dotted prefix."""
    best, where = -1, None
    for key, dev in device_map.items():
        if (key == "" or name == key or name.startswith(key + ".")) and len(key) > best:
            best, where = len(key), dev
    if where is None:
        raise SpecbenchError(f"the device map places no module holding '{name}'")
    return torch.device(f"cuda:{where}" if isinstance(where, int) else where)


def placed_devices(device_map: dict[str, Any] | None) -> list[torch.device]:
    """The distinct compute devices of a device map (GPU indices, "cpu"; "disk" offload is not one)."""
    out: dict[torch.device, None] = {}
    for where in (device_map or {}).values():
        if where != "disk":
            out[torch.device(f"cuda:{where}" if isinstance(where, int) else where)] = None
    return list(out)


def io_devices(model, device_map: dict[str, Any]) -> tuple[torch.device, torch.device]:
    """(input device: the token embedding's, output device: the LM head's) of a placed model."""
    names = {id(m): n for n, m in model.named_modules()}
    embed = names[id(model.get_input_embeddings())]
    head = names[id(model.get_output_embeddings())]
    return module_device(device_map, embed), module_device(device_map, head)
