"""Medusa-1: K heads on the target's last feature f_t; head k guesses the token at t+2+k.

Heads are sequentially independent (a depth-d token is chosen by its rank in head d-1 alone),
and the proposal is a static tree of rank paths ("choices"). Layout as released: each head is
`num_layers` ResBlocks (x + SiLU(Wx + b), W zero-initialised) followed by its own vocab
projection initialised from the target's LM head (`share_lm_head=false`, official Medusa-1), or
feeding the frozen target LM head (`share_lm_head=true`, the legacy layout: a few MB instead of
143 M parameters on SmolLM2, so the CPU reference uses it). State-dict keys are the official
`medusa_head.{k}.{j}.linear.*` / `medusa_head.{k}.{n}.weight`, so released heads load directly.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.core.tree import DraftTree, StaticTree
from methods.base import LearnedDrafter


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # identity at initialisation
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


def static_tree_proposal(root: int, tree: StaticTree, topk_per_depth: torch.Tensor, max_nodes: int) -> DraftTree:
    """Tokens of a static tree whose depth-d node takes rank r of `topk_per_depth[d-1]`."""
    keep = [i for i, d in enumerate(tree.depths) if d <= max_nodes - 1]
    remap = {0: 0}
    tokens, parents = [root], [-1]
    table = topk_per_depth.tolist()
    for i in keep:
        remap[i + 1] = len(tokens)
        tokens.append(table[tree.depths[i] - 1][tree.ranks[i]])
        parents.append(remap[tree.parents[i]])
    return DraftTree(torch.tensor(tokens), torch.tensor(parents))


class Medusa(LearnedDrafter):
    """Medusa-1 heads on the last target feature, static tree of rank paths."""

    name = "medusa"
    defaults: dict[str, Any] = {
        "heads": 5,
        "layers": 1,
        "share_lm_head": True,
        # The best 15 nodes of mc_sim_7b_63 (bf16 here: a 16-token verify costs ~1.2x a step
        # against ~1.6x for 64 tokens). A checkpoint whose config.json has a `decode.tree` (written
        # by `calibrate-tree --save`) uses that instead. The official tree is `--set tree=mc_sim_7b_63`.
        "tree": "cpu_15",
        "draft_vocab": 8192,  # with share_lm_head only; see LearnedDrafter (0 = full vocab)
    }
    arch_keys = ("heads", "layers", "share_lm_head", "draft_vocab")
    input_noise = False  # the Medusa recipe adds no feature noise

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        h, v = target.hidden_size, target.vocab_size
        heads = []
        for _ in range(self.config["heads"]):
            blocks: list[nn.Module] = [ResBlock(h) for _ in range(self.config["layers"])]
            if not self.config["share_lm_head"]:
                proj = nn.Linear(h, v, bias=False)
                proj.weight.data.copy_(target.lm_head.weight.data.float())
                blocks.append(proj)
            heads.append(nn.Sequential(*blocks))
        self.medusa_head = nn.ModuleList(heads)
        self.tree = StaticTree.for_heads(self.config["tree"], self.config["heads"])
        self.to(device=target.device)  # float32 master weights; load_weights casts for inference
        self.feature: torch.Tensor | None = None

    def head_hidden(self, k: int, f: torch.Tensor) -> torch.Tensor:
        """Head k's output before any vocab projection."""
        blocks = self.medusa_head[k]
        n = self.config["layers"]
        for j in range(n):
            f = blocks[j](f)
        return f

    def head_logits(self, k: int, f: torch.Tensor) -> torch.Tensor:
        h = self.head_hidden(k, f)
        if self.config["share_lm_head"]:
            return self.draft_logits(h)
        return self.medusa_head[k][self.config["layers"]](h)

    # ---- decoding -------------------------------------------------------------------------
    def begin(self, prompt, prefill, root: int) -> None:
        self.feature = prefill.hidden[-1]

    def observe(self, step) -> None:
        self.feature = step.hidden[-1]  # feature of the last accepted node: predicts the root

    @torch.inference_mode()
    def propose(self, ctx) -> DraftTree:
        depth = min(self.tree.max_depth, ctx.max_nodes - 1)
        if depth < 1:
            return DraftTree.root_only(ctx.root)
        f = self.feature.to(self.medusa_head[0][0].linear.weight.dtype)
        top = torch.stack([self.head_logits(k, f).topk(self.tree.topk).indices for k in range(depth)])
        return static_tree_proposal(ctx.root, self.tree, top, ctx.max_nodes)

    # ---- official checkpoints ------------------------------------------------------------
    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "Medusa":
        """`medusa_lm_head.pt`: the state dict of the head ModuleList, keys `{i}.{j}.linear.*` and
        `{i}.{L}.weight` (the per-head vocab projection): ours with a `medusa_head.` prefix."""
        from methods.checkpoint_io import read_state

        state = {f"medusa_head.{k}": v for k, v in read_state(folder, cls.name).items()}
        heads = 1 + max(int(k.split(".")[1]) for k in state)
        layers = max(int(k.split(".")[2]) for k in state)
        arch = {"heads": heads, "layers": layers, "share_lm_head": not any(k.endswith(f".{layers}.weight")
                                                                            for k in state),
                "draft_vocab": 0}
        if arch["share_lm_head"]:  # a legacy file holds ResBlocks only
            arch["layers"] = layers + 1
        drafter = cls(target, {**arch, **overrides})
        drafter.load_weights(folder, state=state)
        return drafter

    # ---- training and tree calibration ---------------------------------------------------
    def own_proj(self, k: int) -> nn.Module | None:
        """Head k's own vocab projection (official layout), or None: the frozen LM head."""
        return None if self.config["share_lm_head"] else self.medusa_head[k][self.config["layers"]]

    def teacher_forced_heads(self, batch):
        """(k, offset 2+k, head k's hidden on f_t) for every t that has a token t+2+k to guess."""
        f = batch.features
        for k in range(self.config["heads"]):
            off = 2 + k
            if f.shape[1] <= off:
                break
            yield k, off, self.head_hidden(k, f[:, :-off])

    def loss(self, batch) -> dict[str, torch.Tensor]:
        """Sum over heads of CE(head_k(f_t), token t+2+k) on assistant tokens (Medusa-1)."""
        ids = batch.input_ids
        valid = batch.loss_mask * batch.attention_mask
        total = batch.features.new_zeros(())
        out: dict[str, torch.Tensor] = {}
        for k, off, pred in self.teacher_forced_heads(batch):
            labels = ids[:, off:]
            mask = valid[:, off:]
            if self.config["share_lm_head"]:
                ce, acc = self.head_ce(pred, mask, labels=labels)
            else:
                logits = self.own_proj(k)(pred).float()
                per = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
                ce = (per * mask).sum() / mask.sum().clamp_min(1)
                acc = ((logits.argmax(-1) == labels).float() * mask).sum() / mask.sum().clamp_min(1)
            total = total + ce
            out[f"ce{k}"] = ce.detach()
            out[f"acc{k}"] = acc.detach()
        out["loss"] = total
        return out

