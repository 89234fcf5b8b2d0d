"""Train a drafter for a few seconds on a tiny Llama's own greedy continuations (test helper)."""
from __future__ import annotations

import torch

from harness.decode import GenerationConfig, generate
from harness.train.data import FeatureDataset
from harness.train.features import shard_tensors
from harness.train.trainer import TrainConfig, Trainer


def tiny_prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(6, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def tiny_dataset(target, n: int = 96, new_tokens: int = 48, seed: int = 5) -> FeatureDataset:
    convs = []
    for p in tiny_prompts(target.vocab_size, n, seed):
        out = generate(target, p, GenerationConfig(new_tokens)).output_ids
        convs.append((p + out, len(p)))
    return FeatureDataset([shard_tensors(target, convs, batch_size=32)], holdout=0.05)


def train_quickly(drafter, data: FeatureDataset, out, steps: int = 150, lr: float = 3e-3, **kw) -> dict:
    cfg = TrainConfig(steps=steps, lr=lr, warmup=10, tokens_per_batch=1024, max_len=128, save_every=10_000,
                      eval_every=10_000, autocast="off", **kw)
    return Trainer(drafter, data, cfg, out).train()
