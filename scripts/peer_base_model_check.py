"""Two bugs of the base-model copies some official implementations (peers) decode with, shown on a
target with a RoPE base other than 10,000 and grouped-query attention (SmolLM2-135M: base 100,000,
9 query and 3 key/value heads), and the worker shims that undo them (harness/peers/worker.py).

  rope:     the copy's attention builds RoPE with base 10,000 whatever the config's rope_theta says
            (`<package>/modeling_llama_kv.py` `_init_rope`), so its plain greedy decoding leaves the
            target's (transformers' own model on the same folder); with the rope_theta shim it is
            the target's again.
  kv cache: `<package>/kv_cache.py` sizes the cache by query heads while the attention writes one row
            per key/value head, so the first cached forward fails; with the kv_heads shim it runs
            and its greedy token is the target's.

Run it in the peer's environment (scripts/setup_peers.sh), from the checkout, on a base view of the
target (the folder `cli.py peers` writes: <cache>/peers/<target>/base):
  PYTHONPATH=. .peers/transformers-4.50.1/bin/python scripts/peer_base_model_check.py \\
      --peer-dir ../shared/peers/spec-bench-latest-transformer --package model.medusa --base BASE
(the Hydra repository: --peer-dir ../shared/peers/hydra --package hydra.model, in transformers-4.36.2).
Prints one JSON object; nothing in the peer folder is written.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from pathlib import Path

import torch

from harness.peers.worker import kv_heads_shim, rope_theta_shim

PROMPT = "The three primary colours are"


def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after `ids`, each from a full forward without a cache (the plainest decoding)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def cached_first_token(kv, cache_module, ids: list[int]) -> tuple[int | None, str | None]:
    """The greedy token after `ids` from one forward through the peer's own KV cache, or the error."""
    model = kv.LlamaForCausalLM.from_pretrained(ARGS.base, torch_dtype=torch.float32).eval()
    init = cache_module.initialize_past_key_values
    extra = ["prefix-mlp"] if len(inspect.signature(init).parameters) > 1 else []  # Hydra's takes the head kind
    past, _data, _length = init(model, *extra)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), past_key_values=past).logits
    except RuntimeError as e:
        return None, str(e).splitlines()[0]
    return int(logits[0, -1].argmax()), None


def main() -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(ARGS.peer_dir).resolve()))
    ids = json.loads(ARGS.prompt_ids) if ARGS.prompt_ids else AutoTokenizer.from_pretrained(ARGS.base)(PROMPT)["input_ids"]
    target = greedy(AutoModelForCausalLM.from_pretrained(ARGS.base, torch_dtype=torch.float32).eval(), ids, ARGS.tokens)
    modeling = f"{ARGS.package}.modeling_llama_kv"
    kv = importlib.import_module(modeling)
    cache = importlib.import_module(f"{ARGS.package}.kv_cache")
    plain = greedy(kv.LlamaForCausalLM.from_pretrained(ARGS.base, torch_dtype=torch.float32).eval(), ids, ARGS.tokens)
    _, cache_error = cached_first_token(kv, cache, ids)
    rope_theta_shim([modeling], {})
    shimmed = greedy(kv.LlamaForCausalLM.from_pretrained(ARGS.base, torch_dtype=torch.float32).eval(), ids, ARGS.tokens)
    kv_heads_shim([f"{ARGS.package}.kv_cache"], {})
    cached, cache_error_shimmed = cached_first_token(kv, cache, ids)
    print(json.dumps({"prompt_ids": ids, "target": target, "peer_plain": plain, "peer_rope_shimmed": shimmed,
                      "kv_cache_error": cache_error, "kv_cache_error_shimmed": cache_error_shimmed,
                      "kv_cache_first_token_shimmed": cached}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-dir", required=True, help="the peer's folder (e.g. ../shared/peers/hydra)")
    parser.add_argument("--package", required=True, help="the package holding modeling_llama_kv.py and kv_cache.py")
    parser.add_argument("--base", required=True, help="the target's base view folder")
    parser.add_argument("--tokens", type=int, default=12, help="greedy tokens to compare")
    parser.add_argument("--prompt-ids", help=f"prompt token ids as a JSON list (default: {PROMPT!r} tokenized)")
    ARGS = parser.parse_args()
    sys.exit(main())
