"""EAGLE-1: EAGLE's draft head (methods/common/eagle_core.py) with EAGLE-1's static tree."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from harness.core.tree import DraftTree, StaticTree
from harness.core.tree_build import Level, walk_static_tree
from harness.core.verify import processed_probs, sample_distinct
from methods.common.config_types import kinds
from methods.common.eagle_core import EagleCore
from methods.common.official_layout import target_field

if TYPE_CHECKING:
    from harness.core.decode import DraftContext

# EAGLE-1's own "mc_sim_7b_63" (SafeAILab/EAGLE, eagle/model/choices.py): 25 nodes, depth 5.
EAGLE1_TREE = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0],
               [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0],
               [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


class Eagle(EagleCore):
    """EAGLE-1: the draft head with a static tree (top-k children per node, official 25 nodes)."""

    name = "eagle"
    display_name = "EAGLE"
    paper = "Li et al., ICML 2024"
    year = 2024
    color = "#0072B2"
    order = 50
    checkpoint_layout = "SafeAILab/EAGLE: config.json + pytorch_model.bin (fc.*, layers.0.*)"
    defaults = {**EagleCore.defaults, "tree": EAGLE1_TREE}
    config_types = {"tree": kinds("str", "list")}   # a named tree or its rank paths

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        self.tree = StaticTree.named(self.config["tree"])

    def official_departures(self) -> list[str]:
        """EAGLE's, and what Spec-Bench's EAGLE-1 (model/eagle/, the EAGLE-1 peer) cannot read: its
        draft layer takes RoPE base 10,000 whatever the config says (cnets.py:216) and builds q/k/v
        without bias (cnets.py:208-210)."""
        out = super().official_departures()
        theta = (self.config["layer_config"] or {}).get("rope_theta", target_field(self.target.config, "rope_theta"))
        if theta is not None and float(theta) != 10000.0:
            out.append(f"RoPE base: ours {float(theta):,.0f}; Spec-Bench's EAGLE-1 draft ignores rope_theta and "
                       "uses 10,000 (model/eagle/cnets.py:216), as does its base model (model/eagle/modeling_llama_kv.py:497-499); "
                       "EAGLE-2's read it")
        if self.stack.layers[0].self_attn.q_proj.bias is not None:
            out.append("q/k/v bias: ours has one; Spec-Bench's EAGLE-1 draft builds none (model/eagle/cnets.py:208-210) "
                       "and its strict load refuses the file (model/eagle/ea_model.py:106)")
        return out

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """The static tree is fixed: N keeps its first N nodes (breadth-first, parents first); a
        budget above its 25 nodes or "auto" keeps all of them."""
        return {} if budget == "auto" else {"tree": EAGLE1_TREE[: int(budget)]}

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        """The static tree, each depth's expanded nodes fed to the draft together (each sees the
        committed context and its own ancestors). At T > 0 children are drawn without replacement
        from the draft distribution q, which the verifier needs (lossless multi-draft rejection
        sampling); rows written to the draft cache are dropped afterwards."""
        committed = self._cache.length
        dev = self.target.device
        sampling = ctx.sampling
        hidden_of = {0: self._last}          # node -> draft output predicting its children
        row_of: dict[int, int] = {}          # node -> its row among the cached tree rows
        ancestors: dict[int, list[int]] = {0: []}  # node -> cached tree rows of its ancestors
        q_rows: dict[int, torch.Tensor] = {}       # node -> q over its children (T > 0)

        def rank_children(level: Level) -> list[list[int]]:
            nodes, parents = level.nodes, level.parents
            if level.depth > 0:  # feed the expanding nodes (depth d) to get their outputs
                n_rows = len(row_of)
                for o in nodes:
                    p = parents[o]
                    ancestors[o] = ancestors[p] + ([row_of[p]] if p in row_of else [])
                toks = torch.tensor([level.tokens[o] for o in nodes], device=dev)
                feats = torch.stack([hidden_of[parents[o]] for o in nodes])
                mask = self.tree_mask(committed, [ancestors[o] for o in nodes], n_rows)
                pos = torch.full((len(nodes),), committed + level.depth - 1, device=dev)
                out = self.draft_forward(toks, feats, pos, mask)
                for j, o in enumerate(nodes):
                    hidden_of[o] = out[j]
                    row_of[o] = n_rows + j
            rows = torch.stack([hidden_of[o] for o in nodes])  # one LM-head projection per depth
            if sampling.temperature <= 0:
                return self.vocab.draft_topk(rows, max(self.tree.ranks) + 1)[1].tolist()
            logps, ranked = self.logp(rows), []
            for j, o in enumerate(nodes):
                q = q_rows[o] = processed_probs(logps[j], sampling.temperature, sampling.top_p)
                ranked.append(sample_distinct(q, min(level.need[j], int((q > 0).sum())), ctx.generator))
            return ranked

        tree = walk_static_tree(ctx.root, self.tree, ctx.max_nodes, rank_children)
        self._cache.crop_to(committed)
        if q_rows:
            tree.q = torch.zeros(tree.tokens.numel(), self.target.vocab_size)
            for o, dist in q_rows.items():
                tree.q[o] = dist
        return tree
