"""Drafters for tests/test_check_method.py: a correct one, and four that each break one rule of
the drafter contract (`python cli.py check-method tests.broken_drafters:<Class> --target tiny`).

`ContextLookup` keeps its own copy of the committed context (begin starts it, observe extends it)
and proposes the tokens that followed the latest earlier occurrence of its last token. The broken
ones differ from it in one place each."""
from __future__ import annotations

import torch

from harness.core.tree import DraftTree
from methods.common.base import Drafter


class ContextLookup(Drafter):
    """Correct: a chain copied from the context after the last token's latest earlier occurrence."""

    name = "context-lookup"
    defaults = {"max_draft": 4}

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        self.context = prompt.tolist() + [root]

    def observe(self, step) -> None:
        self.context += step.tokens[1:].tolist() + [step.bonus]  # the root is already in

    def lookup(self, root: int, max_nodes: int) -> DraftTree:
        c = self.context
        for j in range(len(c) - 2, -1, -1):
            if c[j] == c[-1]:
                return DraftTree.chain(root, c[j + 1 : j + 1 + min(self.config["max_draft"], max_nodes - 1)])
        return DraftTree.root_only(root)

    def propose(self, ctx) -> DraftTree:
        return self.lookup(ctx.root, ctx.max_nodes)


class IgnoresObserve(ContextLookup):
    """Broken protocol: observe is a no-op, so every proposal looks up the context as it was at begin."""

    name = "ignores-observe"

    def observe(self, step) -> None:
        pass


class ForgetsNothing(ContextLookup):
    """Broken protocol for a drafter whose proposals rest on its history (`resumable = False`, so no
    resumed answer is compared): begin keeps the earlier answers' tokens, so a repeated answer
    proposes other trees than the first time."""

    name = "forgets-nothing"
    resumable = False

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        self.context = getattr(self, "context", []) + prompt.tolist() + [root]


class ChildBeforeParent(ContextLookup):
    """Broken tree: a valid chain root -> a -> b -> c ..., then stored as [root, b, a, c, ...] with
    b's parent a, so node 1 hangs under node 2, which comes after it (set after the tree was built,
    past DraftTree's own check, as a drafter that edits its tree in place would)."""

    name = "child-before-parent"

    def propose(self, ctx) -> DraftTree:
        tree = super().propose(ctx)
        if tree.size >= 2:
            t = tree.tokens.tolist()
            tree.tokens = torch.tensor([t[0], t[2], t[1], *t[3:]])
            tree.parents = torch.tensor([-1, 2, 0, 1, *range(3, tree.size)][: tree.size + 1])
        return tree


class BiasedBonus(ContextLookup):
    """Broken law: one draft, the root's own token, reported as if drawn from a uniform q. The
    verifier then accepts it with min(1, p/q) instead of p and draws the bonus from max(0, p - q)
    instead of the target's law with the draft removed: a biased bonus token at T > 0."""

    name = "biased-bonus"

    def propose(self, ctx) -> DraftTree:
        tree = DraftTree.chain(ctx.root, [ctx.root]) if ctx.max_nodes > 1 else DraftTree.root_only(ctx.root)
        if ctx.sampling.temperature > 0 and tree.size:
            tree.q = torch.full((2, self.target.vocab_size), 1.0 / self.target.vocab_size)
        return tree
