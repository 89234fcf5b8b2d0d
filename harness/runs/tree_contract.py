"""What a drafter's proposal must be, checked one tree at a time (`cli.py check-method`).

The loop (harness/core/decode.py) verifies whatever tree it gets, so a malformed one shows up as
a crash, a wrong cache commit or a biased law far from its cause; here each rule is named:
  root                    node 0 holds the root token and has parent -1
  parents before children 0 <= parents[i] < i for every draft node
  tokens                  every token id is in the target's vocabulary
  depths                  the tree's depths are those its parents give
  room                    at most `max_nodes - 1` deep (the answer's remaining room)
  budget                  at most the method's tree budget of draft nodes (when it declares one)
  q                       drafts sampled from q: rows of expanded nodes are distributions that give
                          every drafted child a nonzero probability
"""
from __future__ import annotations

import torch

from harness.core.tree import DraftTree

Q_TOLERANCE = 1e-3  # |sum(q row) - 1|


def tree_violations(tree: DraftTree, root: int, max_nodes: int, vocab_size: int,
                    budget: int | None = None) -> list[str]:
    """Every broken rule of one proposal, as "<rule>: <what>" lines (empty: a valid tree).
    Reads the tensors afresh, so a tree changed after it was built is judged as it is now."""
    tokens, parents = tree.tokens.reshape(-1).tolist(), tree.parents.reshape(-1).tolist()
    if len(tokens) != len(parents) or not tokens:
        return [f"root: {len(tokens)} tokens but {len(parents)} parents"]
    out = []
    if tokens[0] != root:
        out.append(f"root: node 0 holds token {tokens[0]}, not the root {root}")
    if parents[0] != -1:
        out.append(f"root: node 0's parent is {parents[0]}, not -1")
    bad = [(i, p) for i, p in enumerate(parents[1:], start=1) if not 0 <= p < i]
    if bad:
        i, p = bad[0]
        where = "comes after it" if p >= i else "is no node"
        out.append(f"parents before children: node {i}'s parent {p} {where} ({len(bad)} such node(s))")
        return out  # depths and the rest are undefined without a valid parent order
    outside = [t for t in tokens if not 0 <= t < vocab_size]
    if outside:
        out.append(f"tokens: id {outside[0]} is outside the vocabulary of {vocab_size}")
    depths = [0] * len(parents)
    for i, p in enumerate(parents[1:], start=1):
        depths[i] = depths[p] + 1
    if tree.depths.tolist() != depths:
        out.append("depths: tree.depths disagrees with its parents (was the tree changed after it was built?)")
    if max(depths) > max_nodes - 1:
        out.append(f"room: {max(depths)} deep with room for {max_nodes} new token(s) (at most {max_nodes - 1} deep)")
    if budget is not None and len(tokens) - 1 > budget:
        out.append(f"budget: {len(tokens) - 1} draft nodes over the tree budget of {budget}")
    if tree.q is not None:
        out += q_violations(tree.q, tokens, parents, vocab_size)
    return out


def q_violations(q: torch.Tensor, tokens: list[int], parents: list[int], vocab_size: int) -> list[str]:
    """The `q` rules: [N+1, V]; an expanded node's row sums to 1, is >= 0, and gives each of its
    drafted children nonzero probability (rows of leaves are never read)."""
    if tuple(q.shape) != (len(tokens), vocab_size):
        return [f"q: shape {list(q.shape)}, expected [{len(tokens)}, {vocab_size}]"]
    for node in sorted(set(parents[1:])):
        row = q[node].float()
        if (row < 0).any() or abs(float(row.sum()) - 1.0) > Q_TOLERANCE:
            return [f"q: node {node}'s row is no distribution (sum {float(row.sum()):.4f})"]
        for child in (i for i, p in enumerate(parents) if p == node):
            if float(row[tokens[child]]) <= 0:
                return [f"q: node {child}'s token {tokens[child]} has q = 0 under node {node}: it cannot have been drawn"]
    return []


def token_paths(tree: DraftTree) -> set[tuple[int, ...]] | None:
    """The tree as the set of its nodes' token paths from the root (the root's token first); None
    for a tree whose parents do not come before their children."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    paths: list[tuple[int, ...]] = []
    for i, p in enumerate(parents):
        if i and not 0 <= p < i:
            return None
        paths.append((tokens[0],) if i == 0 else paths[p] + (tokens[i],))
    return set(paths)


def nested(a: DraftTree, b: DraftTree) -> bool:
    """Whether one tree's token paths all lie in the other's: the same proposal up to how much of
    it a budget kept (a chain cut shorter, fewer of the same ranked nodes). Invalid trees never nest."""
    pa, pb = token_paths(a), token_paths(b)
    return pa is not None and pb is not None and (pa <= pb or pb <= pa)


def same_tree(a: DraftTree, b: DraftTree) -> bool:
    """Identical tokens and parents."""
    return torch.equal(a.tokens.cpu(), b.tokens.cpu()) and torch.equal(a.parents.cpu(), b.parents.cpu())
