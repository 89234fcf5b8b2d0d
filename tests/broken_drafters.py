"""Drafters for tests/test_check_method.py: a correct one, and four that each break one rule of
the drafter contract (`python cli.py check-method tests.broken_drafters:<Class> --target tiny`).

`ContextLookup` keeps its own copy of the committed context (begin starts it, observe extends it)
and proposes the tokens that followed the latest earlier occurrence of its last token. The broken
ones differ from it in one place each."""
from __future__ import annotations

import time

import torch

from harness.core.tree import DraftTree
from harness.core.verify import processed_probs, sample
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


class SampledBigram(Drafter):
    """Correct, and sampling: a chain drawn token by token from a law over the next token made of
    the context's bigram counts (logits `sharpness * count(prev -> y)`), processed with the run's
    temperature; the tree reports the rows it drew from. At T = 0 the argmax chain, no q. The
    q-breaking drafters below differ from it in one place each."""

    name = "sampled-bigram"
    defaults = {"max_draft": 4, "sharpness": 3.0}

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        self.context = prompt.tolist() + [root]

    def observe(self, step) -> None:
        self.context += step.tokens[1:].tolist() + [step.bonus]

    def logits(self, prev: int) -> torch.Tensor:
        """[V] logits of the token after `prev`."""
        counts = torch.zeros(self.target.vocab_size)
        for a, b in zip(self.context, self.context[1:]):
            if a == prev:
                counts[b] += 1
        return self.config["sharpness"] * counts

    def drawn_from(self, logits: torch.Tensor, sampling) -> torch.Tensor:
        """The law a draft is drawn from."""
        return processed_probs(logits, sampling.temperature, sampling.top_p)

    def reported(self, law: torch.Tensor, logits: torch.Tensor, sampling, depth: int) -> torch.Tensor:
        """The law the tree reports for a draft at `depth` (1 = a child of the root)."""
        return law

    def propose(self, ctx) -> DraftTree:
        n = ctx.within_budget(min(self.config["max_draft"], ctx.max_nodes - 1))
        drafts, rows, prev = [], [], ctx.root
        for depth in range(1, n + 1):
            logits = self.logits(prev)
            if ctx.sampling.temperature == 0:
                prev = int(logits.argmax())
            else:
                law = self.drawn_from(logits, ctx.sampling)
                prev = sample(law, ctx.generator)
                rows.append(self.reported(law, logits, ctx.sampling, depth))
            drafts.append(prev)
        tree = DraftTree.chain(ctx.root, drafts)
        if rows:
            tree.q = torch.stack(rows + [torch.zeros_like(rows[0])])
        return tree


class FlatQ(ContextLookup):
    """Broken q: deterministic drafts (the context lookup's chain) reported at T > 0 as drawn from
    a uniform q, the textbook way to bias sampled output."""

    name = "flat-q"

    def propose(self, ctx) -> DraftTree:
        tree = super().propose(ctx)
        if ctx.sampling.temperature > 0 and tree.size:
            tree.q = torch.full((tree.size + 1, self.target.vocab_size), 1.0 / self.target.vocab_size)
        return tree


class UntemperedQ(SampledBigram):
    """Broken q: drafts drawn from the tempered law, the untempered one reported (the same at T = 1)."""

    name = "untempered-q"

    def reported(self, law, logits, sampling, depth):
        return processed_probs(logits, 1.0, sampling.top_p)


class DepthOneQ(SampledBigram):
    """Broken q: the right law at depth 1, a uniform one reported below."""

    name = "depth-one-q"

    def reported(self, law, logits, sampling, depth):
        return law if depth == 1 else torch.full_like(law, 1.0 / law.numel())


class SamplesWithoutQ(SampledBigram):
    """Broken q: drafts drawn at random, but the tree reports no q (claims a point mass)."""

    name = "samples-without-q"

    def propose(self, ctx) -> DraftTree:
        tree = super().propose(ctx)
        tree.q = None
        return tree


class ShortPromptRaises(ContextLookup):
    """Broken on short prompts: propose indexes ten tokens back into the prompt, unguarded."""

    name = "short-prompt-raises"

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        super().begin(prompt, prefill, root)
        self.prompt_length = prompt.numel()

    def propose(self, ctx) -> DraftTree:
        if self.prompt_length < 10:
            raise IndexError(f"prompt of {self.prompt_length} tokens: no token 10 back")
        return super().propose(ctx)


class NoBudgetHook(ContextLookup):
    """Broken budget: no budget_overrides (the base class's {}) and DraftContext.budget ignored, with
    a tree as wide as the context is varied: every distinct context token a child of the root."""

    name = "no-budget-hook"

    def propose(self, ctx) -> DraftTree:
        chain = super().propose(ctx)
        wide = list(dict.fromkeys(self.context[-40:]))[:24] if ctx.max_nodes > 1 else []
        drafts = chain.tokens[1:].tolist()
        extra = [t for t in wide if not drafts or t != drafts[0]]
        return DraftTree(torch.tensor([ctx.root, *drafts, *extra]),
                         torch.tensor([-1, *range(len(drafts)), *[0] * len(extra)]))


class Sleeps(ContextLookup):
    """Broken speed: 50 ms in every propose, far slower than the target it accelerates."""

    name = "sleeps"

    def propose(self, ctx) -> DraftTree:
        time.sleep(0.05)
        return super().propose(ctx)


class ProposesNothing(ContextLookup):
    """Not exercised: the root alone at T > 0 (lossless, trivially, but nothing the law can test)."""

    name = "proposes-nothing"

    def propose(self, ctx) -> DraftTree:
        return DraftTree.root_only(ctx.root) if ctx.sampling.temperature > 0 else super().propose(ctx)


class GreedyOnly(ContextLookup):
    """Declares greedy acceptance only: no q for sampled drafts, so refused at T > 0."""

    name = "greedy-only"
    acceptance_rules = ("greedy",)
