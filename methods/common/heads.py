"""What Medusa and Hydra share: draft heads on the target's features whose ranked guesses fill a
static tree of rank paths, each head read through its own vocab projection or the frozen LM head.

A subclass supplies its heads (`teacher_forced_heads`, `own_proj`), how one depth of the tree is
ranked during decoding (`ranker`) and one head's training loss (`head_loss`); the tree walk
(`harness/core/tree_build.py`) and the summed loss are here.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.core.errors import SpecbenchError
from harness.core.tree import DraftTree, StaticTree
from harness.core.tree_build import RankChildren, walk_static_tree
from methods.common.base import LearnedDrafter
from methods.common.config_types import integer, kinds

if TYPE_CHECKING:
    from harness.core.decode import DraftContext

# Inference and head keys both methods take. The tree is the best 15 nodes of mc_sim_7b_63 (bf16
# on Sapphire Rapids: a 16-token verify costs ~1.2x a step against ~1.6x for 64 tokens; on an
# AMD EPYC with AVX512-BF16 1.15-1.3x against 2.1-2.6x); a checkpoint whose config.json has a
# `decode.tree` (written by `calibrate-tree --save`) uses that instead: "auto" with the fitted
# `tree_candidates` ([rank path, held-out acceptance frequency], most frequent first), sized once
# per run from this machine's verify cost curve, or a fixed list. The official tree is `--set
# tree=mc_sim_7b_63`. `draft_vocab` applies with share_lm_head only.
HEAD_DEFAULTS: dict[str, Any] = {"share_lm_head": True, "tree": "cpu_15", "tree_candidates": None,
                                 "draft_vocab": 8192, "weights": "native"}


class HeadDrafter(LearnedDrafter):
    """Heads 0..heads-1 guess the tokens at depths 1..heads of a static tree (`config['tree']`)."""

    arch_keys = ("heads", "layers", "share_lm_head", "draft_vocab")
    # tree: a preset's name, auto / auto:N (fitted candidates), or a list of rank paths
    config_types = {"heads": integer(1), "layers": integer(0), "draft_vocab": integer(0), "tree": kinds("str", "list")}

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        """The papers' heads each own a projection to the whole vocabulary (initialised from the
        target's LM head); ours may share the target's frozen head."""
        return (["shared head"] if config.get("share_lm_head") else []) + super().departures(config)
    input_noise = False  # neither recipe adds feature noise
    acceptance_rules = ("greedy", "lossless", "typical")  # Medusa's typical rule is for its heads' trees

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        self._tree: StaticTree | None = None
        size = self.fitted_tree_size(self.config)
        if size is not None:
            cands = self.config["tree_candidates"]
            if not cands:
                raise SpecbenchError(f"{self.name}: tree=auto needs the candidates fitted to these heads: run "
                                     f"`cli.py calibrate-tree -m {self.name} --save`, or --set tree=<preset>")
            if size != "auto" and size > len(cands):  # said, not capped: the records would claim N
                raise SpecbenchError(f"{self.name}: tree=auto:{size} asks for {size} draft nodes, but these heads "
                                     f"have {len(cands)} fitted candidates; lower --tree-budget to {len(cands)} or less")
        else:
            self._tree = StaticTree.for_heads(self.config["tree"], self.config["heads"])

    @property
    def tree(self) -> StaticTree:
        """The static tree; with tree "auto", the most frequent fitted candidates that pay most on
        this machine's verify cost curve (measured once per machine, so sized at first use)."""
        if self._tree is None:
            from harness.core.cost_model import best_size, verify_cost_curve

            cands = self.config["tree_candidates"]
            n = self.fitted_tree_size(self.config)
            if n == "auto":
                n = best_size([p for _, p in cands], verify_cost_curve(self.target))
            self._tree = StaticTree.for_heads([path for path, _ in cands[:n]], self.config["heads"])
        return self._tree

    @classmethod
    def fitted_tree_size(cls, config: dict[str, Any]) -> int | str | None:
        """"auto" (tree "auto": sized on this machine's cost curve), N (tree "auto:N": the N most
        frequent fitted candidates), or None (a preset or explicit tree)."""
        tree = config["tree"]
        if tree == "auto":
            return "auto"
        if isinstance(tree, str) and tree.startswith("auto:"):
            try:
                return max(1, int(tree[5:]))
            except ValueError:
                raise SpecbenchError(f"{cls.name}: tree={tree!r}: use auto or auto:N (N draft nodes)") from None
        return None

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """`auto:N` must name a number of nodes (checked before the target loads)."""
        cls.fitted_tree_size(config)

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """The fitted candidates, cost-sized ("auto") or the leading N."""
        return {"tree": "auto" if budget == "auto" else f"auto:{int(budget)}"}

    def own_proj(self, k: int) -> nn.Module | None:
        """Head k's own vocab projection (official layouts), or None: the frozen LM head."""
        raise NotImplementedError

    def head_vocab_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] output of head k -> [..., V] logits (draft-vocab ids only, through the frozen head)."""
        proj = self.own_proj(k)
        return self.vocab.draft_logits(hidden) if proj is None else proj(hidden)

    # ---- decoding -------------------------------------------------------------------------
    def ranker(self, ctx: DraftContext) -> RankChildren:
        """The callback that ranks the children of one depth's expanded nodes for this proposal."""
        raise NotImplementedError

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        return walk_static_tree(ctx.root, self.tree, ctx.max_nodes, self.ranker(ctx))

    # ---- training -------------------------------------------------------------------------
    def teacher_forced_heads(self, batch) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(k, offset, head k's hidden [B, T - offset, H]) for every head that has tokens to guess:
        position t of head k guesses token t + offset."""
        raise NotImplementedError

    def head_loss(self, k: int, off: int, hidden: torch.Tensor, batch,
                  mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cross-entropy, top-1 accuracy) of head k's `hidden` [B, n, H] on `mask` [B, n]."""
        raise NotImplementedError

    def loss(self, batch) -> dict[str, torch.Tensor]:
        """The heads' losses summed, on assistant tokens."""
        valid = batch.loss_mask * batch.attention_mask
        total = batch.features.new_zeros(())
        out: dict[str, torch.Tensor] = {}
        for k, off, hidden in self.teacher_forced_heads(batch):
            ce, acc = self.head_loss(k, off, hidden, batch, valid[:, off:])
            total = total + ce
            out[f"ce{k}"] = ce.detach()
            out[f"acc{k}"] = acc.detach()
        out["loss"] = total
        return out
