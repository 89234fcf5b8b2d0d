"""An n-gram drafter: counts which token followed each short context in the prompt and the answer
so far, and drafts a small tree of the most frequent continuations. Training-free.

Unlike prompt lookup (which copies what followed the latest match), it votes: the root's children
are the `width` most frequent next tokens after the longest known context (backing off from n-1
tokens to 1), and each child's path is extended greedily to `depth`.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import torch

from harness.core.tree import DraftTree
from methods.common.base import Drafter


class NgramDrafter(Drafter):
    """N-gram votes over the context: a tree of the most frequent continuations."""

    name = "ngram"
    display_name = "N-gram"
    paper = "example plugin (examples/ngram_drafter)"
    color = "#44AA99"
    order = 15
    defaults: dict[str, Any] = {"n": 3, "width": 2, "depth": 4}

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        self.counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)  # context -> next-token counts
        self.indexed = 0  # tokens of the committed context counted so far

    def _index(self, tokens: list[int]) -> None:
        """Count every (context of 1..n-1 tokens, next token) pair ending in the new tokens."""
        for j in range(max(1, self.indexed), len(tokens)):
            for m in range(1, self.config["n"]):
                if j - m >= 0:
                    self.counts[tuple(tokens[j - m : j])][tokens[j]] += 1
        self.indexed = len(tokens)

    def _next(self, context: list[int], k: int) -> list[int]:
        """The k most frequent tokens after the longest suffix of `context` that was seen."""
        for m in range(self.config["n"] - 1, 0, -1):
            seen = self.counts.get(tuple(context[-m:]))
            if seen:
                return [t for t, _ in seen.most_common(k)]
        return []

    def propose(self, ctx) -> DraftTree:
        self._index(ctx.tokens)
        depth = min(self.config["depth"], ctx.max_nodes - 1)  # the answer's room
        budget = ctx.within_budget(self.config["width"] * depth)  # at most ctx.budget nodes when one is set
        tokens, parents = [ctx.root], [-1]
        for first in self._next(ctx.tokens, self.config["width"]) if depth > 0 else []:
            path, parent = [first], 0
            while len(tokens) <= budget:
                tokens.append(path[-1])
                parents.append(parent)
                parent = len(tokens) - 1
                nxt = self._next(ctx.tokens + path, 1)
                if len(path) == depth or not nxt:
                    break
                path.append(nxt[0])
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))
