"""Train a drafter for a few seconds on a tiny Llama's own greedy continuations (test helper)."""
from __future__ import annotations

import torch

from harness.core.decode import GenerationConfig, generate
from harness.train.data import FeatureDataset
from harness.train.features import shard_tensors
from harness.train.trainer import TrainConfig, Trainer


def tiny_prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(6, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def tiny_dataset(target, n: int = 96, new_tokens: int = 48, seed: int = 5, holdout: float = 0.05) -> FeatureDataset:
    convs = []
    for p in tiny_prompts(target.vocab_size, n, seed):
        out = generate(target, p, GenerationConfig(new_tokens)).output_ids
        convs.append((p + out, len(p)))
    return FeatureDataset([shard_tensors(target, convs, batch_size=32)], holdout=holdout)


def train_quickly(drafter, data: FeatureDataset, out, steps: int = 150, lr: float = 3e-3, **kw) -> dict:
    cfg = TrainConfig(steps=steps, lr=lr, warmup=10, tokens_per_batch=1024, max_len=128, save_every=10_000,
                      eval_every=10_000, autocast="off", **kw)
    return Trainer(drafter, data, cfg, out).train()


def assert_greedy_exact(target, drafter, seed: int, prompts: int = 12, new_tokens: int = 40) -> None:
    """Greedy output with `drafter` equals AR token for token, and >= 30% of steps accept a draft
    (so the accepted-path cache commit is really exercised)."""
    drafter.eval()
    shares = []
    for p in tiny_prompts(target.vocab_size, prompts, seed=seed):
        ar = generate(target, p, GenerationConfig(new_tokens))
        sp = generate(target, p, GenerationConfig(new_tokens), drafter)
        assert sp.output_ids == ar.output_ids
        shares += [a > 0 for a in sp.accepted]
    assert sum(shares) / len(shares) >= 0.3, sum(shares) / len(shares)


def assert_tree_logits_match_paths(target, prefix: torch.Tensor, tree, atol: float = 1e-4) -> None:
    """One tree-masked forward on a cached prefix gives, at every node, the logits of a plain
    causal forward over prefix + that node's root->node path.

    Within `atol`, not bit for bit: the two are different float32 computations (a masked tree
    attention over N+1 rows vs a causal one over the path; GEMMs of other shapes pick other kernels
    per CPU). Their logits differ by ~1e-6 relative (a few 1e-5 on SmolLM2's logits of magnitude
    ~20), while a wrong mask or position moves them by O(1)."""
    cache = target.new_cache()
    target.forward(prefix, cache)
    start = cache.length
    out = target.forward(tree.tokens, cache, position_ids=start + tree.depths, tree_mask=tree.attention_mask)
    for node in range(tree.size + 1):
        path = [node]
        while tree.parent_list[path[-1]] >= 0:
            path.append(tree.parent_list[path[-1]])
        seq = torch.cat([prefix, tree.tokens[path[::-1]]])
        ref = target.forward(seq, target.new_cache(), logits="last").logits[-1]
        assert (out.logits[node] - ref).abs().max() < atol, node


def vicuna7b_meta(cls, init=None):
    """`cls` built at Vicuna-7B sizes on the meta device (no memory), for parameter/key counts
    (full vocab, as the released checkpoints: no draft vocabulary)."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                      num_key_value_heads=32, num_hidden_layers=32)
    with torch.device("meta"):
        fake = SimpleNamespace(config=cfg, hidden_size=4096, vocab_size=32000, device=torch.device("meta"),
                               name="vicuna-7b", dtype=torch.float16,
                               lm_head=torch.nn.Linear(4096, 32000, bias=False))
        d = cls.__new__(cls)
        (init or (lambda d, t: cls.__init__(d, t, {"draft_vocab": 0})))(d, fake)
    return d
