"""Sharding a target over several GPUs (`--device-map auto`), proved on the meta device: the plan
covers every module, keeps layer order across GPUs, and puts the drafter with the LM head (beside
the last layer). No GPU is needed; on a machine without one the option is one clear line."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from harness.core.errors import SpecbenchError
from harness.core.placement import check_device_map, module_device, plan_device_map

GIB = 1 << 30


def seventy_b_like(layers: int = 16) -> LlamaConfig:
    """LLaMA-70B's shape scaled to 1/8 width (8192 -> 1024): big enough to need several 'GPUs'."""
    return LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=layers,
                       num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=False)


def test_a_model_larger_than_one_gpu_is_split_in_layer_order():
    cfg = seventy_b_like()
    # ~0.56 GB of bf16 weights (16 layers of 27 MB, embedding and head of 66 MB each); 0.2 GiB per
    # device forces at least three devices.
    plan = plan_device_map(cfg, torch.bfloat16, {i: int(0.2 * GIB) for i in range(4)} | {"cpu": 0})
    layer_devices = [module_device(plan, f"model.layers.{i}").index for i in range(cfg.num_hidden_layers)]
    assert layer_devices == sorted(layer_devices), "layers must go to GPUs in order"
    assert len(set(layer_devices)) >= 3
    assert all(isinstance(v, int) for v in plan.values()), f"something was offloaded: {plan}"
    head = module_device(plan, "lm_head")
    assert head == module_device(plan, "model.norm")
    assert head.index >= layer_devices[-1]
    assert module_device(plan, "model.embed_tokens").index == layer_devices[0]


def test_a_model_that_fits_stays_on_one_gpu():
    plan = plan_device_map(seventy_b_like(layers=2), torch.bfloat16, {0: 8 * GIB, 1: 8 * GIB, "cpu": 0})
    assert {module_device(plan, n) for n in ("model.embed_tokens", "model.layers.1", "lm_head")} == \
        {torch.device("cuda:0")}


def test_module_device_takes_the_longest_prefix():
    plan = {"model.embed_tokens": 0, "model.layers": 1, "model.layers.7": 2, "lm_head": "cpu"}
    assert module_device(plan, "model.layers.7.mlp") == torch.device("cuda:2")
    assert module_device(plan, "model.layers.70") == torch.device("cuda:1")  # not a prefix of .7
    assert module_device(plan, "lm_head") == torch.device("cpu")
    with pytest.raises(SpecbenchError):
        module_device(plan, "model.norm")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_device_map_without_gpus_is_one_line():
    with pytest.raises(SpecbenchError, match="torch sees none"):
        check_device_map("auto")
    with pytest.raises(SpecbenchError, match="unknown device map"):
        check_device_map("everywhere")
    check_device_map(None)
