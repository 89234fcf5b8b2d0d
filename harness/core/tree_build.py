"""Building draft trees, once for every drafter: a static tree of rank paths walked level by level
(Medusa, Hydra, EAGLE-1), a pool of scored candidates cut to a budget (EAGLE-2, Gumiho), and a
trie of token sequences (Lookahead's n-grams).

A drafter supplies only what is its own: for a static tree, a callback that ranks the children
of the nodes expanded at one depth (Medusa's heads on one feature, Hydra's per-path states,
EAGLE's draft forward); for a dynamic tree, the candidates it scored. The tokens, parents and
node order of the result are decided here, so every method builds them the same way.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from harness.core.tree import DraftTree, StaticTree


@dataclass
class Node:
    """A draft node before it is placed in a DraftTree: `parent` indexes the node list it sits in
    (-1 = the root), `depth` counts from the root (1 = a child of the root), `score` is the
    drafter's cumulative log-prob. `borrowed` marks Gumiho's exact-FTA copies of trunk tokens."""

    token: int
    parent: int
    score: float
    depth: int
    borrowed: bool = False


# ---- static trees -------------------------------------------------------------------------
@dataclass
class Level:
    """One depth of a static-tree walk, as the ranking callback sees it.

    depth: depth of the expanded nodes (0 = the root alone);
    nodes: their indices in the tree being built (0 = the root), in tree order;
    need:  per node, how many ranks its children use (its largest child rank + 1);
    tokens, parents: the tree built so far (read-only), parents[i] < i, parents[0] = -1.
    """

    depth: int
    nodes: list[int]
    need: list[int]
    tokens: list[int]
    parents: list[int]


# Ranked token ids per expanded node: ranked[j][r] is node j's rank-r child token. A list shorter
# than need[j] (a sampled draft with fewer tokens of nonzero probability) drops the missing ranks.
RankChildren = Callable[[Level], list[list[int]]]


def walk_static_tree(root: int, tree: StaticTree, max_nodes: int, rank_children: RankChildren,
                     budget: int | None = None) -> DraftTree:
    """The tokens of `tree` under `root`: level by level, the nodes with children are expanded
    together and node i of the static tree takes rank `tree.ranks[i]` of its parent's ranking.
    Depth is capped at `max_nodes - 1` (the room left in the answer), size at `budget` draft nodes
    (DraftContext.budget: the first ones, a set closed under parents). Nodes come out in the static
    tree's order (by depth, then by rank path), since each level is expanded in tree order."""
    if budget is not None and budget < len(tree.nodes):
        tree = tree.first(budget)
    depth = min(tree.max_depth, max_nodes - 1)
    tokens, parents = [root], [-1]
    ours = {0: 0}          # static node id (0 = root) -> index in tokens
    frontier = [0]
    for d in range(depth):
        expand = [n for n in frontier if n in tree.children]
        if not expand:
            break
        need = [max(tree.ranks[c - 1] for c in tree.children[n]) + 1 for n in expand]
        ranked = rank_children(Level(d, [ours[n] for n in expand], need, tokens, parents))
        frontier = []
        for n, top in zip(expand, ranked):
            for c in tree.children[n]:
                r = tree.ranks[c - 1]
                if r >= len(top):
                    continue
                ours[c] = len(tokens)
                tokens.append(top[r])
                parents.append(ours[n])
                frontier.append(c)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents))


# ---- dynamic trees: a candidate pool cut to a budget ---------------------------------------
def rerank(scores: torch.Tensor, parents: list[int], keep: int) -> list[int]:
    """Indices of the `keep` best candidates, ascending (parents precede children).

    The set is closed under parents: a candidate's score is its parent's plus a log-prob (<= 0),
    so it never beats its parent, and ties (a child of probability ~1) are broken by index with a
    stable sort, which puts the parent (always the lower index) first. So the tree has exactly
    `keep` nodes whatever the weights, on every CPU.
    """
    keep = min(keep, scores.numel())
    order = torch.sort(scores, descending=True, stable=True).indices[:keep]
    chosen = sorted(order.tolist())
    kept = set(chosen)
    assert all(parents[c] < 0 or parents[c] in kept for c in chosen), "a child scored above its parent"
    return chosen


@dataclass
class CandidatePool:
    """Scored draft candidates of a dynamic tree (EAGLE-2's beam, Gumiho's serial + MLP levels).

    tokens[c], scores[c] (cumulative draft log-prob) and parents[c] (a candidate id, -1 = the root)
    per candidate id c; a candidate is added after its parent, so parents[c] < c.
    """

    tokens: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, tokens: list[int], scores: list[float], parents: list[int]) -> list[int]:
        """Append candidates; returns their ids."""
        first = len(self.tokens)
        self.tokens.extend(tokens)
        self.scores.extend(scores)
        self.parents.extend(parents)
        return list(range(first, len(self.tokens)))

    def select(self, keep: int, max_nodes: int) -> list[Node]:
        """The `keep` best candidates (`rerank`) as nodes, dropping those deeper than the answer's
        remaining room `max_nodes - 1` (and so their descendants)."""
        index: dict[int, int] = {}   # candidate id -> node index
        nodes: list[Node] = []
        for c in rerank(torch.tensor(self.scores), self.parents, keep):
            par = self.parents[c]
            if par != -1 and par not in index:
                continue  # its parent was cut by the depth limit below
            depth = 1 if par == -1 else nodes[index[par]].depth + 1
            if depth > max_nodes - 1:
                continue
            index[c] = len(nodes)
            nodes.append(Node(self.tokens[c], -1 if par == -1 else index[par], self.scores[c], depth))
        return nodes


def build_tree(root: int, nodes: list[Node]) -> DraftTree:
    """The DraftTree of `root` and `nodes` (parents before children); scores ride along for records."""
    return DraftTree(torch.tensor([root] + [n.token for n in nodes]),
                     torch.tensor([-1] + [n.parent + 1 for n in nodes]),
                     scores=torch.tensor([0.0] + [n.score for n in nodes]))


# ---- tries of token sequences -------------------------------------------------------------
def trie_tree(root: int, sequences: Iterable[Sequence[int]], max_depth: int, max_nodes: int | None = None) -> DraftTree:
    """Token sequences under `root` merged into one tree, a shared prefix drafted once. Each is cut
    to `max_depth` tokens; nodes are added in the order given until `max_nodes` (None: no limit),
    so the sequence that reaches the limit keeps only the prefix that fits."""
    tokens, parents = [root], [-1]
    child: dict[tuple[int, int], int] = {}  # (node, token) -> node
    for seq in sequences:
        node = 0
        for tok in list(seq)[:max(0, max_depth)]:
            nxt = child.get((node, tok))
            if nxt is None:
                if max_nodes is not None and len(tokens) - 1 >= max_nodes:
                    return DraftTree(torch.tensor(tokens), torch.tensor(parents))
                nxt = child[(node, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = nxt
    return DraftTree(torch.tensor(tokens), torch.tensor(parents))
