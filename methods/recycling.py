"""Token Recycling (Luo et al., 2024): an adjacency matrix holds each token's top-k next tokens
as the target last predicted them, and a static tree template is filled from it: a node's
children are the ranked row of its token. Nothing is trained.

Every verify recycles the target's logits: the top-k at every verified node, rejected nodes
included, overwrite the rows of those nodes' tokens (`update="tree"`, as the official code does;
"path": the accepted path's rows only). A token in the tree more than once gets its row from the
accepted path if it lies there, else from its last node (the official code leaves duplicates to
the order of a scatter). A token never seen has no row and so no children (the official code
drafts token 0 under it, which the target never picks here).

State across answers: the official runner keeps one matrix for the whole benchmark; here each
answer starts empty (`keep_across_answers` false), so an answer never depends on which questions
ran before it, in which process or order (resumed runs, Ray tasks, the method rotation), as for
every other method; `--set recycling.keep_across_answers=true` keeps the matrix as the paper does.
At T > 0 the drafts are deterministic (point mass, q = None) and the shared verifier's recursive
rejection keeps the target's law (the official runner verifies greedily only).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.tree import DraftTree, StaticTree
from harness.core.tree_build import Level, walk_static_tree
from methods.common.base import Drafter

if TYPE_CHECKING:
    from harness.core.decode import Acceptance, DraftContext

# The official runner's default template (`tree_version` "2.2.2", Spec-Bench
# model/recycling/tree_template_.py): 80 rank paths, depth 6, ranks < 8.
TREE_222 = [
    [0], [1], [2], [3], [4], [5], [6], [7],
    [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3], [2, 0], [2, 1],
    [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0], [0, 1, 1],
    [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0], [1, 0, 0], [1, 0, 1],
    [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 2, 0],
    [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
    [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0],
]
# SAM-Decoding's Token Recycling tree (its config/token_recycle.json, as rank paths): 60 nodes, depth 5.
TREE_SAMD = [
    [0], [1], [2], [3], [4], [5], [6],
    [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [1, 0], [1, 1], [1, 2], [1, 3], [1, 4], [2, 0], [2, 1], [2, 2],
    [3, 0], [3, 1], [4, 0], [4, 1], [5, 0], [6, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [1, 0, 0],
    [1, 0, 1], [1, 0, 2], [1, 1, 0], [1, 1, 1], [1, 2, 0], [1, 3, 0], [2, 0, 0], [2, 1, 0], [3, 0, 0], [4, 0, 0],
    [5, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 1], [1, 1, 0, 0], [2, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0],
]
TEMPLATES = {"2.2.2": TREE_222, "samd": TREE_SAMD}
UPDATES = ("tree", "path")


class TokenRecycling(Drafter):
    """Token Recycling: each token's top-k successors from the target's verified logits fill a static tree template."""

    name = "recycling"
    display_name = "Token Recycling"
    paper = "Luo et al., 2024 (arXiv 2408.08696)"
    year = 2024
    color = "#999933"
    order = 15
    defaults: dict[str, Any] = {
        "tree": "2.2.2",          # template name ("2.2.2": the official 80 nodes; "samd": SAM-Decoding's 60) or rank paths
        "topk": 8,                # successors kept per token (the official `output_id_topk`)
        "update": "tree",         # rows from every verified node ("tree", official) or the accepted path's ("path")
        "keep_across_answers": False,  # True: one matrix for the whole run, as the official runner
    }

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        tree = self.config["tree"]
        self.tree = StaticTree(TEMPLATES[tree]) if isinstance(tree, str) and tree in TEMPLATES else StaticTree.named(tree)
        if self.config["update"] not in UPDATES:
            raise SpecbenchError(f"recycling.update={self.config['update']!r}: one of {', '.join(UPDATES)}")
        if self.tree.topk > int(self.config["topk"]):
            raise SpecbenchError(f"recycling: the tree uses rank {self.tree.topk - 1}, but topk={self.config['topk']} "
                                 f"keeps ranks below {self.config['topk']}; raise --set recycling.topk")
        v = target.vocab_size
        self.k = min(int(self.config["topk"]), v)               # a vocabulary smaller than topk has fewer ranks
        self.adjacency = torch.zeros(v, self.k, dtype=torch.long)   # [V, k] ranked successors per token
        self.seen = torch.zeros(v, dtype=torch.bool)           # rows written at least once

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """N keeps the official template's first N nodes (breadth-first, parents first); "auto"
        or more than its 80 nodes keeps them all."""
        return {} if budget == "auto" else {"tree": TREE_222[: int(budget)]}

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        if not self.config["keep_across_answers"]:
            self.seen.zero_()

    def propose(self, ctx: DraftContext) -> DraftTree:
        def rank_children(level: Level) -> list[list[int]]:
            toks = torch.tensor([level.tokens[n] for n in level.nodes])
            rows, known = self.adjacency[toks].tolist(), self.seen[toks].tolist()
            return [row[:need] if ok else [] for row, ok, need in zip(rows, known, level.need)]

        return walk_static_tree(ctx.root, self.tree, ctx.max_nodes, rank_children)

    def observe(self, step: Acceptance) -> None:
        """Rows from the verified logits: every node's (the path's last, so they win), or the path's."""
        k = self.k
        if self.config["update"] == "tree":
            on_path = set(step.path)
            nodes = [i for i in range(step.tree.tokens.numel()) if i not in on_path] + list(step.path)
            rows = torch.tensor(nodes, device=step.tree_logits.device)
            successors = step.tree_logits[rows].topk(k, dim=-1).indices.cpu()   # [N+1, k]
            tokens = step.tree.tokens[nodes]
        else:
            successors, tokens = step.logits.topk(k, dim=-1).indices.cpu(), step.tokens  # [A+1, k], [A+1]
        last = {t: i for i, t in enumerate(tokens.tolist())}   # a token's last row wins
        self.adjacency[list(last)] = successors[list(last.values())]
        self.seen[list(last)] = True
