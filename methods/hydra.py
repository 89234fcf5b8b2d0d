"""Hydra++ ("prefix-mlp"): sequentially dependent heads over a one-layer prefix attention.

A prefix layer (one decoder layer of the target's architecture + final norm, with its own KV
cache) runs over the target's features f and gives z_t. Head i sees [z_t, emb(x_{t+1}), ...,
emb(x_{t+i+1})] (the path so far, root included) and guesses x_{t+i+2}: a ResBlock_in
(R x + SiLU(W x + b), W zero-initialised) then `layers - 1` ResBlocks, then a vocab projection
(own, initialised from the target LM head, as released; or the frozen target head with
`share_lm_head=true`, the CPU reference). Trained with the teacher (soft-target) loss against the
target's own next-token distribution. The official code builds the later ResBlocks by list
multiplication (one shared block); ours are distinct, and the official loader copies the shared
tensor into each block.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.core.draft_layers import DecoderStack
from harness.core.packed_linear import apply_linear
from harness.core.tree_build import Level, RankChildren
from methods.common.heads import HEAD_DEFAULTS, HeadDrafter
from methods.common.blocks import ResBlock
from methods.common.config_types import number

if TYPE_CHECKING:
    from harness.core.decode import Acceptance, DraftContext
    from harness.core.target import TargetOutput


class ResBlockIn(nn.Module):
    """R x + SiLU(W x + b): a ResBlock whose input is wider than its output."""

    def __init__(self, d_in: int, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, hidden)
        nn.init.zeros_(self.linear.weight)
        self.res_connection = nn.Linear(d_in, hidden)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_linear(self.res_connection, x) + self.act(apply_linear(self.linear, x))


class HydraHead(nn.Module):
    def __init__(self, index: int, hidden: int, vocab: int, layers: int, share_lm_head: bool, dropout: float) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Dropout(dropout), ResBlockIn(hidden * (index + 2), hidden)]
        for _ in range(layers - 1):
            blocks += [nn.Dropout(dropout), ResBlock(hidden)]
        blocks.append(nn.Dropout(dropout))
        self.body = nn.Sequential(*blocks)
        self.proj = None if share_lm_head else nn.Linear(hidden, vocab, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Hydra(HeadDrafter):
    """Hydra++: prefix attention + sequentially dependent heads, static tree of rank paths."""

    name = "hydra"
    display_name = "Hydra"
    paper = "Ankner et al., COLM 2024"
    year = 2024
    color = "#B8A200"
    order = 40
    checkpoint_layout = "zankner/Hydra: hydra_lm_head.pt / .safetensors (+ config.json hydra_num_heads)"
    defaults: dict[str, Any] = {"heads": 4, "layers": 4, **HEAD_DEFAULTS, "dropout": 0.2}
    config_types = {"dropout": number(0, 1)}
    default_lr = 5e-4

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        h, v = target.hidden_size, target.vocab_size
        self.prefix = DecoderStack(target.config, 1, first_input_norm=True, final_norm=True)
        self.hydra_head = nn.ModuleList(
            HydraHead(i, h, v, self.config["layers"], self.config["share_lm_head"], self.config["dropout"])
            for i in range(self.config["heads"]))
        if not self.config["share_lm_head"]:
            for head in self.hydra_head:
                head.proj.weight.data.copy_(target.lm_head.weight.data.float())
                nn.init.zeros_(head.proj.bias)
        self.to(device=target.device)
        self._cache = None
        self._z: torch.Tensor | None = None

    @property
    def _dtype(self) -> torch.dtype:
        return self.hydra_head[0].body[1].linear.weight.dtype

    def _emb(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids).to(self._dtype)

    def own_proj(self, i: int) -> nn.Module | None:
        return self.hydra_head[i].proj

    # ---- decoding -------------------------------------------------------------------------
    def head_hidden(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """[n, (k + 2) H] path states -> [n, H]: head k's output before the vocab projection."""
        return self.hydra_head[k](x)

    def _prefix_step(self, feats: torch.Tensor) -> None:
        start = self._cache.length
        pos = torch.arange(start, start + feats.shape[0], device=feats.device)[None]
        z = self.prefix(feats.to(self._dtype)[None], pos, self._cache)
        self._z = z[0, -1]

    @torch.inference_mode()
    def begin(self, prompt: torch.Tensor, prefill: TargetOutput, root: int) -> None:
        self._cache = self.prefix.new_cache(capacity=prefill.hidden.shape[0] + 1024)
        self._prefix_step(prefill.hidden)

    @torch.inference_mode()
    def observe(self, step: Acceptance) -> None:
        self._prefix_step(step.hidden)

    def ranker(self, ctx: DraftContext) -> RankChildren:
        """Sequentially dependent heads: a node's children are ranked by head d on its own path
        state [z, emb(root), emb(d1), ..., emb(node)] ([(d + 2) H])."""
        device = self._z.device
        states = {0: torch.cat([self._z, self._emb(torch.tensor([ctx.root], device=device))[0]])}

        def rank_children(level: Level) -> list[list[int]]:
            fresh = [o for o in level.nodes if o not in states]
            if fresh:  # one embedding lookup and one concat per level, not one per node
                tokens = torch.tensor([level.tokens[o] for o in fresh], device=device)
                parents = torch.stack([states[level.parents[o]] for o in fresh])
                states.update(zip(fresh, torch.cat([parents, self._emb(tokens)], dim=-1)))
            x = torch.stack([states[o] for o in level.nodes])
            logits = self.head_vocab_logits(level.depth, self.head_hidden(level.depth, x))
            return logits.topk(max(level.need), dim=-1).indices.tolist()

        return rank_children

    # ---- official checkpoints ------------------------------------------------------------
    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "Hydra":
        """`hydra_lm_head.pt` (prefix-mlp, grounded): `prefix_embeding_layer.*` -> `prefix.*`,
        `hydra_mlp.{i}.{j}` -> `hydra_head.{i}.body.{j}` (same Sequential indices, Dropouts included;
        the official shared ResBlock tensor lands in each of our distinct blocks),
        `hydra_lm_head.{i}.1.*` -> `hydra_head.{i}.proj.*`. The unused prefix embedding, the copy of
        the base embedding (`input_embed_fn`) and the stored `inv_freq` are dropped."""
        from methods.common.checkpoint_io import read_state

        mapped = {}
        for k, v in read_state(folder, cls.name).items():
            if k.startswith("prefix_embeding_layer."):
                if "embed_tokens" in k or "inv_freq" in k:
                    continue
                mapped["prefix." + k[len("prefix_embeding_layer."):]] = v
            elif k.startswith("hydra_mlp."):
                i, rest = k[len("hydra_mlp."):].split(".", 1)
                mapped[f"hydra_head.{i}.body.{rest}"] = v.clone()
            elif k.startswith("hydra_lm_head."):
                i, rest = k[len("hydra_lm_head."):].split(".", 1)
                mapped[f"hydra_head.{i}.proj.{rest.split('.', 1)[1]}"] = v
        heads = 1 + max(int(k.split(".")[1]) for k in mapped if k.startswith("hydra_head."))
        layers = (1 + max(int(k.split(".")[3]) for k in mapped if ".body." in k)) // 2
        share = not any(".proj." in k for k in mapped)
        drafter = cls(target, {"heads": heads, "layers": layers, "share_lm_head": share, "draft_vocab": 0,
                               **overrides})
        drafter.load_weights(folder, state=mapped)
        return drafter

    # ---- training and tree calibration ---------------------------------------------------
    def teacher_forced_heads(self, batch) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(i, offset i+2, head i's hidden at t fed the true path x_{t+1..t+i+1}) for every t that
        has a token x_{t+i+2} to guess."""
        f = batch.features
        b, t, _ = f.shape
        pos = torch.arange(t, device=f.device)[None].expand(b, t)
        z = self.prefix(f, pos)
        emb = self.target.embed(batch.input_ids).to(f.dtype)
        for i in range(self.config["heads"]):
            off = i + 2
            if t <= off:
                break
            n = t - off
            x = torch.cat([z[:, :n]] + [emb[:, 1 + j : 1 + j + n] for j in range(i + 1)], dim=-1)
            yield i, off, self.hydra_head[i](x)

    def head_loss(self, i: int, off: int, hidden: torch.Tensor, batch,
                  mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher loss: head i at t, fed the true path tokens ids[t+1..t+i+1], is scored with soft
        targets softmax(lm_head(f_{t+i+1})) — the target's distribution for x_{t+i+2}."""
        teacher = batch.target_features[:, i + 1 : i + 1 + hidden.shape[1]]
        proj = self.own_proj(i)
        if proj is None:
            return self.vocab.head_ce(hidden, mask, target_hidden=teacher)
        logq = proj(hidden).float().log_softmax(-1)
        p = self.target.project(teacher.to(self.target.dtype)).float().softmax(-1)
        ce = (-(p * logq).sum(-1) * mask).sum() / mask.sum().clamp_min(1)
        acc = ((logq.argmax(-1) == p.argmax(-1)).float() * mask).sum() / mask.sum().clamp_min(1)
        return ce, acc
