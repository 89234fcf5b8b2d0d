"""Token Recycling (Luo et al., ACL 2025): an adjacency matrix holds each token's top-k next tokens
as the target predicted them, and a static tree template is filled from it: a node's children
are the ranked row of its token. Nothing is trained.

Every verify recycles the target's logits, the top-k at every verified node, rejected nodes
included. How a row is kept (`update`):
  "tree"     as the official code: every node's row overwrites its token's (the accepted path's
             last, so it wins over a rejected duplicate; the official scatter leaves that order to
             the device). The matrix starts empty.
  "context"  (default) the text speaks first: a token of the text so far keeps the row of its
             last occurrence in the text (the prompt's rows from the prefill's features, through
             the target's LM head, as SAM-Decoding's Token Recycling seeds them; then each step's
             accepted path), and a rejected node's row is kept only for a token the text has not
             shown. The matrix is then a function of the text wherever the text says something,
             so a resumed answer drafts what the running one did (`check-method`'s protocol), and
             the prompt's tokens have rows from the first step on.
A token never seen has no row and so no children (the official code drafts token 0 under it).

State across answers: the official runner keeps one matrix for the whole benchmark; here each
answer starts anew (`keep_across_answers` false), so an answer never depends on which questions
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
from methods.common.config_types import Takes, integer, one_of

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
UPDATES = ("context", "tree")
SEED_ROWS = 256  # prompt rows projected through the LM head at once (a [256, V] logits block)


class TokenRecycling(Drafter):
    """Token Recycling: each token's top-k successors from the target's verified logits fill a static tree template."""

    name = "recycling"
    display_name = "Token Recycling"
    paper = "Luo et al., ACL 2025 (arXiv 2408.08696)"
    year = 2025
    color = "#999933"
    order = 15
    defaults: dict[str, Any] = {
        "tree": "2.2.2",          # template name ("2.2.2": the official 80 nodes; "samd": SAM-Decoding's 60) or rank paths
        "topk": 8,                # successors kept per token (the official `output_id_topk`)
        "update": "context",      # "context": the text's rows first (and the prompt's); "tree": every node's, as official
        "keep_across_answers": False,  # True: one matrix for the whole run, as the official runner
    }
    config_types = {"tree": Takes(("list",), tuple(TEMPLATES)), "topk": integer(1), "update": one_of(*UPDATES)}

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        tree = self.config["tree"]
        self.tree = StaticTree(TEMPLATES[tree]) if isinstance(tree, str) and tree in TEMPLATES else StaticTree.named(tree)
        if self.tree.topk > int(self.config["topk"]):
            raise SpecbenchError(f"recycling: the tree uses rank {self.tree.topk - 1}, but topk={self.config['topk']} "
                                 f"keeps ranks below {self.config['topk']}; raise --set recycling.topk")
        v = target.vocab_size
        self.k = min(int(self.config["topk"]), v)               # a vocabulary smaller than topk has fewer ranks
        self.adjacency = torch.zeros(v, self.k, dtype=torch.long)   # [V, k] ranked successors per token
        self.seen = torch.zeros(v, dtype=torch.bool)           # rows written at least once
        self.in_text = torch.zeros(v, dtype=torch.bool)        # tokens of this answer's text ("context" rows)

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        """The official code updates every row from every verified node and keeps one matrix for the run."""
        return (["text-first rows"] if config.get("update", "tree") == "context" else []) + (
            [] if config.get("keep_across_answers", True) else ["per-answer matrix"])

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """N keeps the official template's first N nodes (breadth-first, parents first); "auto"
        or more than its 80 nodes keeps them all."""
        return {} if budget == "auto" else {"tree": TREE_222[: int(budget)]}

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        if not self.config["keep_across_answers"]:
            self.seen.zero_()
        self.in_text.zero_()
        if self.config["update"] == "context":
            self.seed(prompt, prefill.hidden)

    @torch.inference_mode()
    def seed(self, prompt: torch.Tensor, hidden: torch.Tensor) -> None:
        """Rows of the prompt's tokens from their last occurrence: the target's top-k there, from
        the prefill's features [P, H] through its LM head, in blocks of SEED_ROWS rows."""
        last = {t: i for i, t in enumerate(prompt.tolist())}
        tokens, rows = list(last), torch.tensor(list(last.values()))
        for i in range(0, len(tokens), SEED_ROWS):
            block = rows[i : i + SEED_ROWS].to(hidden.device)
            top = self.target.project(hidden[block]).topk(self.k, dim=-1).indices.cpu()
            self.write(tokens[i : i + SEED_ROWS], top)
        self.in_text[tokens] = True

    def propose(self, ctx: DraftContext) -> DraftTree:
        def rank_children(level: Level) -> list[list[int]]:
            toks = torch.tensor([level.tokens[n] for n in level.nodes])
            rows, known = self.adjacency[toks].tolist(), self.seen[toks].tolist()
            return [row[:need] if ok else [] for row, ok, need in zip(rows, known, level.need)]

        return walk_static_tree(ctx.root, self.tree, ctx.max_nodes, rank_children)

    def observe(self, step: Acceptance) -> None:
        """Rows from every verified node's logits: the path's written last, so they win; in
        "context" mode a rejected node's row only for a token not in the text."""
        on_path = set(step.path)
        rejected = [i for i in range(step.tree.tokens.numel()) if i not in on_path]
        if self.config["update"] == "context":
            known = (self.in_text[step.tree.tokens] | torch.isin(step.tree.tokens, step.tokens)).tolist()
            rejected = [i for i in rejected if not known[i]]
        nodes = rejected + list(step.path)
        rows = torch.tensor(nodes, device=step.tree_logits.device)
        self.write(step.tree.tokens[nodes].tolist(), step.tree_logits[rows].topk(self.k, dim=-1).indices.cpu())
        self.in_text[step.tokens] = True

    def write(self, tokens: list[int], successors: torch.Tensor) -> None:
        """adjacency[tokens[i]] = successors[i] ([n, k]); a later row of the same token wins."""
        last = {t: i for i, t in enumerate(tokens)}
        self.adjacency[list(last)] = successors[list(last.values())]
        self.seen[list(last)] = True
