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
        return self.dynamic_tree(ctx)
