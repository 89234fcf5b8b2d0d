"""Shared pytest fixtures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def in_ci() -> bool:
    """True under a CI runner (CI=true, as GitHub Actions and most CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The benchmark data folder: $SPECBENCH_DATA, else ../shared/data beside the checkout (X/main -> X/shared).

    Without the prompts the tests that need them skip with one line saying how to get them; under
    CI=true they fail instead, so a CI job cannot pass while testing nothing.
    """
    from harness.runs.benchmarks import BENCHMARKS

    env = os.environ.get("SPECBENCH_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    missing = [name for name, e in BENCHMARKS.items() if not (path / e["dir"] / e["file"]).is_file()]
    if missing:
        what = "" if len(missing) == len(BENCHMARKS) else f" (missing {', '.join(missing)})"
        msg = (f"benchmark prompts not in {path}{what}: run `python cli.py fetch-data DIR`, "
               "then set SPECBENCH_DATA=DIR (the CLI takes --data-dir DIR)")
        if in_ci():
            pytest.fail(msg + " [CI=true: missing prompts fail]", pytrace=False)
        pytest.skip(msg)
    return path


def _tiny_llama(vocab: int = 96, hidden: int = 64, layers: int = 2, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float().eval()
    # Sharpen the output so greedy text is not a flat tie-fest and sampling has structure.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def make_tiny_target(vocab: int = 96, hidden: int = 64, layers: int = 2, seed: int = 0):
    import torch

    from harness.core.target import Target

    return Target(_tiny_llama(vocab, hidden, layers, seed), None, "tiny-llama", torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def tiny_target():
    return make_tiny_target()


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The real SmolLM2-135M target in float32, loaded once per session (installed by scripts/setup.sh)."""
    from harness.core.target import Target

    return Target.load("smollm2-135m", "cpu", "float32")
