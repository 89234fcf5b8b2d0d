"""REST (He et al., NAACL 2024): retrieval-based drafts. The longest suffix of the context (the
root included, 2 to 16 tokens) that occurs in a datastore is looked up; the `continuation` tokens
after each of its first `max_matches` occurrences are merged into a trie whose nodes count the
continuations through them, and the `num_draft` most frequent nodes become the draft tree.
Nothing is trained; the datastore is a token index built once by `cli.py datastore build`
(methods/common/token_index.py; the default corpus is the training prompts plus the target's
distilled answers, never a benchmark question).

As the official code (Spec-Bench model/rest, DraftRetriever): spans tried from 16 tokens down
to 2, the first 5,000 occurrences in suffix order, 10 tokens after each, a trie of at most 64
nodes. Choices where it leaves one: nodes of equal count are ranked shallower first, then by
(parent, token id) (the official heap leaves ties to a hash order); since a node never counts
more than its parent, the kept nodes always form a trie. When nothing matches, the tree is the
root alone (the official code drafts the fixed token 100). Continuations stop at a document's
end (the official datastore runs one document into the next). The drafts are deterministic
(point mass, q = None): at T > 0 the shared verifier's recursive rejection is lossless.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.tree import DraftTree
from harness.core.tree_build import Node, build_tree
from methods.common.base import Drafter
from methods.common.config_types import integer
from methods.common.token_index import SEPARATOR, load_datastore

if TYPE_CHECKING:
    from harness.core.decode import DraftContext


def trie_nodes(continuations: np.ndarray, keep: int, max_depth: int) -> list[Node]:
    """The `keep` most frequent prefixes of the rows of `continuations` [m, L] (SEPARATOR-padded),
    at most `max_depth` deep, as nodes (parents first); score = log(count / m)."""
    m, width = continuations.shape
    found: list[tuple[int, int, int, int, int]] = []   # (-count, depth, order, token, parent order)
    ids = np.zeros(m, dtype=np.int64)                  # each row's trie node at the depth before (index into it)
    order_of: list[int] = [-1]                          # trie node id at the depth before -> its `order`
    for d in range(min(width, max_depth)):
        alive = continuations[:, d] != SEPARATOR
        if not alive.any():
            break
        keys = ids[alive] * (int(continuations.max()) + 2) + continuations[alive, d]
        uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        first = np.zeros(uniq.size, dtype=np.int64)
        first[inverse] = np.flatnonzero(alive)          # any row of the node: to read its token and parent
        base = len(found)
        for j in range(uniq.size):
            row = int(first[j])
            found.append((-int(counts[j]), d + 1, base + j, int(continuations[row, d]), order_of[int(ids[row])]))
        order_of = [base + j for j in range(uniq.size)]
        ids = np.zeros(m, dtype=np.int64)   # rows ended here stay ended (continuations are SEPARATOR-padded)
        ids[alive] = inverse
    chosen = sorted(found)[:keep]
    index = {f[2]: i for i, f in enumerate(chosen)}
    return [Node(tok, index[parent] if parent >= 0 else -1, math.log(-neg / m), depth)
            for neg, depth, _, tok, parent in chosen]


class Rest(Drafter):
    """REST: continuations of the longest suffix match in a datastore, merged into a trie of the most frequent ones."""

    name = "rest"
    display_name = "REST"
    paper = "He et al., NAACL 2024"
    year = 2024
    color = "#88CCEE"
    order = 13
    defaults: dict[str, Any] = {
        "datastore": "default",  # a name built by `cli.py datastore build` (default: the project's corpus) or a folder
        "num_draft": 64,         # trie nodes kept (draft tokens per verify)
        "max_span": 16,          # longest context suffix looked up
        "min_span": 2,           # shortest
        "continuation": 10,      # tokens after each occurrence (the official `long`)
        "max_matches": 5000,     # occurrences read (the official `k`)
    }
    config_types = {"num_draft": integer(1), "max_span": integer(1), "min_span": integer(1),
                    "continuation": integer(1), "max_matches": integer(1)}

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        self.index = load_datastore(str(self.config["datastore"]), target)

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """N keeps the N most frequent trie nodes; "auto" the official 64."""
        return {} if budget == "auto" else {"num_draft": int(budget)}

    def propose(self, ctx: DraftContext) -> DraftTree:
        cfg = self.config
        length, lo, hi = self.index.longest_suffix(ctx.tokens, cfg["max_span"], cfg["min_span"])
        if not length:
            return DraftTree.root_only(ctx.root)
        rows = self.index.continuations(lo, hi, length, cfg["continuation"], cfg["max_matches"])
        return build_tree(ctx.root, trie_nodes(rows, cfg["num_draft"], ctx.max_nodes - 1))
