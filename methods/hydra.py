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
from methods.common.official_layout import KeyMap, OfficialFiles, exported, target_field, vocab_departure
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
    # `hydra_lm_head.pt` (prefix-mlp, grounded) is the state dict of the official head module
    # (hydra/model/hydra_heads/prefix_mlp_head.py:53-100): `prefix_embeding_layer.*` <-> `prefix.*`,
    # `hydra_mlp.{i}.{j}` <-> `hydra_head.{i}.body.{j}` (the same Sequential indices, Dropouts
    # included), `hydra_lm_head.{i}.1.*` <-> `hydra_head.{i}.proj.*`. The prefix layer's unused
    # embedding, its stored `inv_freq` and the module's copy of the base embedding
    # (`input_embed_fn`) are skipped when read and written from the target.
    official_keys = KeyMap(pairs=(("prefix_embeding_layer.", "prefix."), ("hydra_mlp.{i}.", "hydra_head.{i}.body."),
                                  ("hydra_lm_head.{i}.1.", "hydra_head.{i}.proj.")),
                           official_only=("prefix_embeding_layer.embed_tokens.", "rotary_emb.inv_freq", "input_embed_fn."),
                           ours_only=("draft_ids",))

    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "Hydra":
        """`hydra_lm_head.pt` through `official_keys`; the official shared ResBlock tensor lands in
        each of our distinct blocks."""
        from methods.common.checkpoint_io import read_state

        mapped = cls.official_keys.to_ours(read_state(folder, cls.name))
        heads = 1 + max(int(k.split(".")[1]) for k in mapped if k.startswith("hydra_head."))
        layers = (1 + max(int(k.split(".")[3]) for k in mapped if ".body." in k)) // 2
        share = not any(".proj." in k for k in mapped)
        drafter = cls(target, {"heads": heads, "layers": layers, "share_lm_head": share, "draft_vocab": 0,
                               **overrides})
        drafter.load_weights(folder, state=mapped)
        return drafter

    def official_files(self, base_model: str | None = None) -> OfficialFiles:
        """zankner/Hydra's layout (Spec-Bench's Hydra reads it too): hydra_lm_head.pt with every key
        of the official module, loaded non-strictly (hydra_model.py:186), and the config.json of
        HydraConfig (hydra_model.py:25-41) for the prefix-mlp, grounded heads."""
        heads, layers = self.config["heads"], self.config["layers"]
        weights = {k: exported(v) for k, v in self.official_keys.to_official(self.state_dict()).items()}
        embedding = exported(self.target.embed_tokens.weight)
        attn = self.prefix.layers[0].self_attn
        theta = float(target_field(self.target.config, "rope_theta") or 10000.0)
        weights["prefix_embeding_layer.embed_tokens.weight"] = embedding  # never read: the prefix gets inputs_embeds
        weights["prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq"] = \
            1.0 / theta ** (torch.arange(0, attn.head_dim, 2).float() / attn.head_dim)  # a persistent buffer there
        weights["input_embed_fn.weight"] = embedding  # the base model's own embedding, registered in the module
        departures = []
        if self.config["share_lm_head"]:
            head, zero = exported(self.target.lm_head.weight), torch.zeros(self.target.vocab_size)
            for i in range(heads):
                weights.update({f"hydra_lm_head.{i}.1.weight": head, f"hydra_lm_head.{i}.1.bias": zero})
            departures.append("vocab projection: ours reads the target's frozen LM head, each official head owns a "
                              "trained one with a bias (hydra/model/hydra_heads/prefix_mlp_head.py:93-95); written "
                              "as copies of the target's head with zero bias, which decode as ours")
        departures += vocab_departure(self, "hydra/model/hydra_heads/prefix_mlp_head.py:94")
        shared = list(range(3, 2 * layers, 2))  # body indices of the blocks after ResBlock_in
        if len(shared) > 1:  # the official Sequential repeats one block object: one set of weights per head
            for i in range(heads):
                for part in ("weight", "bias"):
                    first = weights[f"hydra_mlp.{i}.{shared[0]}.linear.{part}"]
                    weights.update({f"hydra_mlp.{i}.{j}.linear.{part}": first for j in shared})
            departures.append(f"ResBlocks: ours {len(shared)} distinct after each head's first, the official head "
                              "repeats one (hydra/model/hydra_heads/prefix_mlp_head.py:83); written as the first of "
                              f"them (body index {shared[0]}) in every place")
        if theta != 10000.0:
            departures.append(f"RoPE base: ours {theta:,.0f}; the official prefix layer, like its base model, takes "
                              "10,000 whatever rope_theta says (hydra/model/modeling_llama_kv.py:497-499; its cos/sin "
                              "cache is built at init, L161-165, so the inv_freq written here is not read)")
        config = {"hydra_num_heads": heads, "hydra_num_layers": layers, "hydra_head_arch": "prefix-mlp",
                  "grounded_heads": True, "hidden_state_offset": 0,
                  "base_model_name_or_path": base_model or self.target.name}
        return OfficialFiles(weights, "hydra_lm_head.pt", config, departures)

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
