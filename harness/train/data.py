"""Training batches of distilled conversations: token ids, target features, loss masks.

Every method trains from the same `FeatureDataset` with the same split and the same batches, so
a comparison of methods is a comparison of methods, not of data.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from harness.core.errors import SpecbenchError


@dataclass
class DistillBatch:
    """input_ids [B, T]; features [B, T, H] target last-layer normed hidden states (with input
    noise when the trainer adds it); target_features [B, T, H] the clean ones; loss_mask [B, T]
    1 on assistant tokens; attention_mask [B, T] 1 on real tokens (right padding);
    layer_features [B, T, k*H] the inputs of the target layers a drafter reads besides (its
    `target_layers()`, concatenated in that order; EAGLE-3), None for the others."""

    input_ids: torch.Tensor
    features: torch.Tensor
    target_features: torch.Tensor
    loss_mask: torch.Tensor
    attention_mask: torch.Tensor
    layer_features: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


@dataclass
class Sequence:
    ids: torch.Tensor       # [n] long
    hidden: torch.Tensor    # [n, H] bf16
    prompt_len: int
    layers: torch.Tensor | None = None  # [n, k*H] bf16: the extra layers' inputs, concatenated
    key: int = 0            # prompt_key: the split is by prompt


HOLDOUT_SHARE = 0.03  # of prompts, by a hash of each conversation's first user turn


def unit_hash(data: bytes, salt: bytes = b"") -> float:
    """A uniform number in [0, 1) from `data`: stable across machines, shard orders and runs."""
    h = hashlib.sha256(salt + data).digest()
    return int.from_bytes(h[:4], "little") / 2**32


def opening_hash(ids: torch.Tensor, salt: bytes = b"") -> float:
    """A uniform number in [0, 1) from a conversation's opening ids [n] (the train share's key)."""
    return unit_hash(ids[:64].numpy().tobytes(), salt)


def prompt_key(first_turn: str) -> int:
    """The split key of a conversation: a signed 64-bit hash of its first user turn's text, so a
    follow-up conversation and every sampled answer to one prompt fall on the same side."""
    return int.from_bytes(hashlib.sha256(first_turn.encode()).digest()[:8], "little", signed=True)


def ids_key(prompt_ids: torch.Tensor) -> int:
    """`prompt_key` for conversations known only by ids (tests): a hash of the prompt's ids [p]."""
    return int.from_bytes(hashlib.sha256(prompt_ids.numpy().tobytes()).digest()[:8], "little", signed=True)


def is_held_out(key: int, share: float) -> bool:
    """Whether the conversations of a prompt (its `prompt_key`) fall in the held-out `share`. The
    split is by prompt: no held-out prompt is ever trained on, whatever its answers' openings."""
    return unit_hash(key.to_bytes(8, "little", signed=True)) < share


def check_train_share(share: float) -> None:
    """A train share is in (0, 1]; anything else is one clear error."""
    if not 0.0 < share <= 1.0:
        raise SpecbenchError(f"--train-share must be in (0, 1], got {share}")


def in_train_share(ids: torch.Tensor, share: float) -> bool:
    """Whether a training conversation is among the `share` kept for a smaller-data run: an
    independent hash, so the shares nest (the quarter is inside the half) and the held-out split
    does not move."""
    return share >= 1.0 or opening_hash(ids, b"train-share") < share


class FeatureDataset:
    """Feature shards in memory (1 M tokens x 576 x bf16 is ~1.2 GB per layer), split train/held-out
    by prompt (`prompt_key`: stable across machines and shard orders)."""

    def __init__(self, shards: Iterable[dict[str, torch.Tensor]], holdout: float = HOLDOUT_SHARE,
                 layers: list[int] | None = None, train_share: float = 1.0) -> None:
        """`layers`: also keep these extra layers' inputs (shard keys `layer_<i>`, see features.py);
        `train_share`: train on this share of the training conversations (the data curve; 0 keeps
        the held-out set alone); the held-out set is the same whatever the share. Each kept
        conversation gets its own copy, so a shard (and what a share leaves out) is freed as soon
        as the next one is read: give a generator of shards to hold one at a time."""
        self.train: list[Sequence] = []
        self.valid: list[Sequence] = []
        for shard in shards:
            off = shard["offsets"].tolist()
            for i in range(len(off) - 1):
                a, b = off[i], off[i + 1]
                ids = shard["input_ids"][a:b].long()
                plen = int(shard["prompt_len"][i])
                key = int(shard["prompt_key"][i]) if "prompt_key" in shard else ids_key(ids[:plen])
                held_out = is_held_out(key, holdout)
                if not held_out and not in_train_share(ids, train_share):
                    continue
                extra = torch.cat([shard[f"layer_{j}"][a:b] for j in layers], dim=-1) if layers else None
                seq = Sequence(ids, shard["hidden"][a:b].clone(), plen, extra, key)
                (self.valid if held_out else self.train).append(seq)

    @property
    def train_tokens(self) -> int:
        return sum(len(s.ids) - s.prompt_len for s in self.train)


def frequent_answer_tokens(seqs: list[Sequence], n: int, vocab_size: int) -> torch.Tensor:
    """The `n` ids most frequent among answer tokens (ties: more frequent in prompts, then the
    lower id), sorted: a drafter's draft vocabulary, a function of the training split alone."""
    answer = torch.zeros(vocab_size, dtype=torch.long)
    prompt = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        answer += torch.bincount(s.ids[s.prompt_len:], minlength=vocab_size)
        prompt += torch.bincount(s.ids[: s.prompt_len], minlength=vocab_size)
    ids = torch.arange(vocab_size)
    key = answer * (prompt.max() + 1) * vocab_size + prompt * vocab_size + (vocab_size - 1 - ids)
    return key.topk(n).indices.sort().values


def collate(seqs: list[Sequence], max_len: int) -> DistillBatch:
    width = min(max_len, max(len(s.ids) for s in seqs))
    h = seqs[0].hidden.shape[-1]
    b = len(seqs)
    ids = torch.zeros(b, width, dtype=torch.long)
    feats = torch.zeros(b, width, h, dtype=torch.bfloat16)
    loss = torch.zeros(b, width)
    att = torch.zeros(b, width)
    extra = None if seqs[0].layers is None else torch.zeros(b, width, seqs[0].layers.shape[-1], dtype=torch.bfloat16)
    for r, s in enumerate(seqs):
        n = len(s.ids)
        # Long conversations keep their last max_len tokens: that is where the answer is.
        start = max(0, n - width)
        m = n - start
        ids[r, :m] = s.ids[start:]
        feats[r, :m] = s.hidden[start:]
        if extra is not None:
            extra[r, :m] = s.layers[start:]
        att[r, :m] = 1
        loss[r, max(0, s.prompt_len - start) : m] = 1
    f = feats.float()
    return DistillBatch(ids, f, f, loss, att, None if extra is None else extra.float())


def batches(seqs: list[Sequence], tokens_per_batch: int, max_len: int, seed: int, epoch: int):
    """Length-bucketed batches of about `tokens_per_batch` padded tokens, shuffled per epoch."""
    rng = random.Random(seed * 1000 + epoch)
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].ids), rng.random()))
    groups, cur, width = [], [], 0
    for i in order:
        n = min(max_len, len(seqs[i].ids))
        if cur and max(width, n) * (len(cur) + 1) > tokens_per_batch:
            groups.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    for g in groups:
        yield collate([seqs[i] for i in g], max_len)
