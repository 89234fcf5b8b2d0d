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

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.core.tree_build import Level, RankChildren
from methods.common.blocks import ResBlock
from methods.common.heads import HEAD_DEFAULTS, HeadDrafter
from methods.common.official_layout import KeyMap, OfficialFiles, exported, vocab_departure

if TYPE_CHECKING:
    from harness.core.decode import Acceptance, DraftContext
    from harness.core.target import TargetOutput


class Medusa(HeadDrafter):
    """Medusa-1 heads on the last target feature, static tree of rank paths."""

    name = "medusa"
    display_name = "Medusa"
    paper = "Cai et al., ICML 2024"
    year = 2024
    color = "#009E73"
    order = 30
    checkpoint_layout = "FasterDecoding/Medusa: medusa_lm_head.pt (+ config.json medusa_num_heads)"
    defaults: dict[str, Any] = {"heads": 5, "layers": 1, **HEAD_DEFAULTS}

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
        self.to(device=target.device)  # float32 master weights; load_weights casts for inference
        self.feature: torch.Tensor | None = None

    def head_hidden(self, k: int, f: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., H]: head k's output before any vocab projection."""
        blocks = self.medusa_head[k]
        for j in range(self.config["layers"]):
            f = blocks[j](f)
        return f

    def head_logits(self, k: int, f: torch.Tensor) -> torch.Tensor:
        """[..., H] feature -> [..., V] logits of head k."""
        return self.head_vocab_logits(k, self.head_hidden(k, f))

    def own_proj(self, k: int) -> nn.Module | None:
        return None if self.config["share_lm_head"] else self.medusa_head[k][self.config["layers"]]

    # ---- decoding -------------------------------------------------------------------------
    def begin(self, prompt: torch.Tensor, prefill: TargetOutput, root: int) -> None:
        self.feature = prefill.hidden[-1]

    def observe(self, step: Acceptance) -> None:
        self.feature = step.hidden[-1]  # feature of the last accepted node: predicts the root

    def ranker(self, ctx: DraftContext) -> RankChildren:
        """Sequentially independent heads: every depth-d node takes the same top-k, head d's on f."""
        f = self.feature.to(self.medusa_head[0][0].linear.weight.dtype)

        def rank_children(level: Level) -> list[list[int]]:
            top = self.head_logits(level.depth, f).topk(self.tree.topk).indices.tolist()
            return [top] * len(level.nodes)

        return rank_children

    # ---- official checkpoints ------------------------------------------------------------
    # `medusa_lm_head.pt` is the state dict of the official head ModuleList: ours without the
    # `medusa_head.` prefix (`{i}.{j}.linear.*`, and `{i}.{L}.weight` for the vocab projection).
    official_keys = KeyMap(pairs=(("{i}.", "medusa_head.{i}."),), ours_only=("draft_ids",))
    OFFICIAL_HEADS = 5  # what FasterDecoding's loader builds, whatever the config says (medusa_model.py:143)

    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "Medusa":
        """`medusa_lm_head.pt` through `official_keys`; the per-head vocab projection, when present,
        makes share_lm_head false."""
        from methods.common.checkpoint_io import read_state

        state = cls.official_keys.to_ours(read_state(folder, cls.name))
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

    def official_files(self, base_model: str | None = None) -> OfficialFiles:
        """FasterDecoding/Medusa's layout (Spec-Bench's Medusa reads it too): medusa_lm_head.pt, each
        head with its own vocab projection (ours sharing the target's: written as that head, one
        tensor under every head's key), and a config.json without `model_type`, so the FasterDecoding
        loader takes its head-file path (medusa_model.py:132-141)."""
        heads, layers = self.config["heads"], self.config["layers"]
        weights = {k: exported(v) for k, v in self.official_keys.to_official(self.state_dict()).items()}
        departures = []
        if self.config["share_lm_head"]:
            head = exported(self.target.lm_head.weight)
            weights.update({f"{i}.{layers}.weight": head for i in range(heads)})
            departures.append("vocab projection: ours reads the target's frozen LM head, each official head owns a "
                              "trained one (medusa/model/medusa_model.py:115); written as copies of the target's "
                              "head, which decode as ours")
        departures += vocab_departure(self, "medusa/model/medusa_model.py:115")
        if layers > 1:  # the official head repeats one ResBlock object: one set of weights per head
            for i in range(heads):
                for part in ("weight", "bias"):
                    first = weights[f"{i}.0.linear.{part}"]
                    weights.update({f"{i}.{j}.linear.{part}": first for j in range(1, layers)})
            departures.append(f"ResBlocks: ours {layers} distinct per head, the official head repeats one "
                              "(medusa/model/medusa_model.py:114); written as the first block's weights in every place")
        if heads != self.OFFICIAL_HEADS:
            departures.append(f"heads: ours {heads}; FasterDecoding's loader builds {self.OFFICIAL_HEADS} whatever the "
                              "config says (medusa/model/medusa_model.py:143) and loads non-strictly (L157): a missing "
                              "head stays random, an extra one is dropped; Spec-Bench's reads medusa_num_heads")
        config = {"medusa_num_heads": heads, "medusa_num_layers": layers,
                  "base_model_name_or_path": base_model or self.target.name}
        return OfficialFiles(weights, "medusa_lm_head.pt", config, departures)

    # ---- training and tree calibration ---------------------------------------------------
    def teacher_forced_heads(self, batch) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(k, offset 2+k, head k's hidden on f_t) for every t that has a token t+2+k to guess."""
        f = batch.features
        for k in range(self.config["heads"]):
            off = 2 + k
            if f.shape[1] <= off:
                break
            yield k, off, self.head_hidden(k, f[:, :-off])

    def head_loss(self, k: int, off: int, hidden: torch.Tensor, batch,
                  mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CE(head_k(f_t), token t+2+k) with hard labels (Medusa-1)."""
        labels = batch.input_ids[:, off:]
        if self.own_proj(k) is None:
            return self.vocab.head_ce(hidden, mask, labels=labels)
        logits = self.own_proj(k)(hidden).float()
        per = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        ce = (per * mask).sum() / mask.sum().clamp_min(1)
        acc = ((logits.argmax(-1) == labels).float() * mask).sum() / mask.sum().clamp_min(1)
        return ce, acc
