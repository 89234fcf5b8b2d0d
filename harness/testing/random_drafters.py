"""Random-initialised drafters of every built-in method on a given target: what the device tests and
scripts/gpu_check.py run where no trained weights exist (a bare GPU box, a tiny test target).

Random weights make poor drafts, but exactness does not depend on them: greedy verification must
return AR's tokens whatever is proposed, and every method's tree, masks and cache paths still run.
Each drafter is cast to the target's device and dtype, as loading a checkpoint does.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

# Training-free methods that read a datastore, and the config key that names it.
DATASTORE_KEYS = {"rest": "datastore", "samd": "corpus"}

def method_settings(name: str, budget: int) -> dict[str, Any]:
    """Config overrides for a random-initialised `name` drafter with about `budget` draft tokens per
    verify: the full vocabulary (there is no fitted draft vocabulary), fixed tree sizes (no cost
    curve to measure), static trees for the heads (no fitted candidates)."""
    if name in ("medusa", "hydra"):
        tree = "mc_sim_7b_63" if budget >= 63 else "cpu_31" if budget >= 31 else "cpu_15" if budget >= 15 else "cpu_7"
        return {"draft_vocab": 0, "tree": tree}
    if name == "eagle":
        return {"draft_vocab": 0}
    if name in ("eagle2", "gumiho", "eagle3"):
        return {"draft_vocab": 0, "total_tokens": budget + 1}
    if name == "sps":
        return {"gamma": 4}
    return {}


def random_datastore(target) -> Path:
    """A datastore for `target`'s vocabulary (REST's, SAM-Decoding's corpus): seeded random documents,
    each a segment repeated, so lookups find matches; built once per vocabulary in the temp folder."""
    from harness.core.errors import SpecbenchError
    from methods.common.token_index import TokenIndex

    folder = Path(tempfile.gettempdir()) / "specbench-random-datastores" / target.vocab_hash()
    try:
        TokenIndex.load(folder, target.vocab_hash())
    except SpecbenchError:
        g = torch.Generator().manual_seed(0)
        docs = [torch.randint(0, target.vocab_size, (int(n),), generator=g).tolist()
                for n in torch.randint(4, 24, (400,), generator=g)]
        TokenIndex.build([d * 3 for d in docs], {"vocab_hash": target.vocab_hash()}).save(folder)
    return folder


def datastore_settings(name: str, target) -> dict[str, Any]:
    """{key: a random datastore for `target`} for a method that reads one, else {}."""
    key = DATASTORE_KEYS.get(name)
    return {key: str(random_datastore(target))} if key else {}


def layers_needed(name: str) -> int:
    """Decoder layers a target needs for `name`: EAGLE-3 reads the inputs of three distinct layers
    (2, L//2 and L-3), which takes 7."""
    return 7 if name == "eagle3" else 1


def builtin_methods() -> list[str]:
    """The built-in method names (methods/registry.py), in the papers' order."""
    from methods.registry import method_info, method_names, method_source

    return sorted((n for n in method_names() if method_source(n) == "built-in"), key=lambda n: method_info(n).order)


def perturbed_copy(target, scale: float = 0.02, seed: int = 5):
    """A draft LM for SpS: the target's own weights plus small noise (same vocabulary), on its device."""
    from harness.core.target import Target

    with torch.device(target.device):  # a fresh module: a deep copy would also copy packed-weight caches
        model = type(target.model)(target.model.config).to(target.dtype).eval()
    model.load_state_dict(target.model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g).to(device=p.device, dtype=p.dtype)
            p.add_(noise * scale * p.float().std().clamp_min(1e-3).to(p.dtype))
    return Target(model, target.tokenizer, f"{target.name}-perturbed", target.device, target.dtype)


def random_drafter(target, name: str, budget: int = 15, seed: int = 0):
    """The `name` drafter with random weights (seeded) on `target`'s device and dtype, in eval mode."""
    from methods.registry import get_method

    cls = get_method(name)
    settings = {**method_settings(name, budget), **datastore_settings(name, target)}
    torch.manual_seed(seed)
    if name == "sps":
        return cls(target, {**settings, "draft": "perturbed copy"}, draft=perturbed_copy(target))
    drafter = cls(target, settings)
    return drafter.to(device=target.device, dtype=target.dtype).eval()
