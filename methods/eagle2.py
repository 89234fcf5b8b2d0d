"""EAGLE-2: EAGLE's weights with the dynamic draft tree.

Per cycle: the root pass gives the top-k depth-1 candidates (the first beam); then `depth`
expansion steps: the k beams are fed together (each sees the committed context and its own
chain of ancestor beams: the draft-side tree mask), each proposes its top-k children scored by
cumulative draft log-prob, all k² children are kept as candidates and the top-k of them by score
become the next beam. Finally the pooled candidates (k + depth·k²) are reranked and the best
`total_tokens - 1` kept as the tree (with total_tokens "auto", as many as pay on this machine, and
only one expansion step more than the last tree used is run). At T > 0 the drafts are deterministic (point-mass) and the
shared verifier applies recursive rejection; its bonus token is drawn from the temperature/top-p
processed distribution (the official code's last bonus skips that processing; ours does not).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from harness.core.tree import DraftTree
from harness.core.tree_build import CandidatePool, build_tree
from methods.common.eagle_core import EagleCore

if TYPE_CHECKING:
    from harness.core.decode import DraftContext


class Eagle2(EagleCore):
    """EAGLE-2: EAGLE's draft head with the dynamic (beam + rerank) tree."""

    name = "eagle2"
    display_name = "EAGLE-2"
    paper = "Li et al., EMNLP 2024"
    year = 2024
    color = "#D55E00"
    order = 60
    checkpoint_layout = "EAGLE's weights (SafeAILab/EAGLE layout)"
    weights_from = "eagle"
    defaults: dict[str, Any] = {
        **EagleCore.defaults,
        # The tree budget is sized every step from this machine's measured verify cost curve
        # ("auto", harness/core/cost_model.py): the best fixed size differs between CPU kinds (a
        # 32-token verify costs ~1.3x a step in bf16 on Sapphire Rapids, 1.6-2x on an AMD EPYC),
        # and on the EPYC auto beat every fixed size (README). An integer fixes it (the official
        # GPU setting: top_k 10, depth 5, total 60; `--set total_tokens=32` for machine-independent τ).
        "top_k": 8,
        "depth": 4,
        "total_tokens": "auto",
    }

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        k = self.config["top_k"]
        # Expansion step s drafts tree level s + 2 (the root pass gives level 1).
        depth = max(0, self.auto_depth(min(self.config["depth"], ctx.max_nodes - 2) + 1) - 1)
        dev = self.target.device
        committed = self._cache.length
        top_score, top_tok = self.vocab.draft_topk(self._last, k)
        pool = CandidatePool()
        beam = pool.add(top_tok.tolist(), top_score.tolist(), [-1] * k)  # candidate ids of the current beam
        beam_feat = self._last.expand(k, -1)   # output of each beam's parent
        anc_rows: dict[int, list[int]] = {-1: []}  # candidate -> cached tree rows of it and its ancestors
        n_rows = 0
        for step in range(depth):
            toks = torch.tensor([pool.tokens[c] for c in beam], device=dev)
            mask = self.tree_mask(committed, [anc_rows[pool.parents[c]] for c in beam], n_rows)
            pos = torch.full((len(beam),), committed + step, device=dev)
            out = self.draft_forward(toks, beam_feat, pos, mask)
            for j, c in enumerate(beam):
                anc_rows[c] = anc_rows[pool.parents[c]] + [n_rows + j]
            n_rows += len(beam)
            child_score, child_tok = self.vocab.draft_topk(out, k)      # [beams, k]
            cu = torch.tensor([pool.scores[c] for c in beam])[:, None] + child_score.cpu()
            children = pool.add(child_tok.flatten().tolist(), cu.flatten().tolist(), [c for c in beam for _ in range(k)])
            best = torch.topk(cu.flatten(), min(k, cu.numel())).indices.tolist()
            beam = [children[b] for b in best]
            beam_feat = out[[b // k for b in best]]
        self._cache.crop_to(committed)
        self.last_pool_size = len(pool)  # k + depth * k^2 (tests check it)
        nodes = pool.select(self.tree_budget(pool.scores), ctx.max_nodes)
        self.note_kept(nodes)
        return build_tree(ctx.root, nodes)
