"""A test-only drafter that knows the target's continuation: it proposes a tree holding the true
next tokens down to a chosen depth among random distractor branches, so the loop's accept and
cache-commit paths are exercised with known answers."""
from __future__ import annotations

import random

import torch

from harness.core.tree import DraftTree
from methods.common.base import Drafter


class OracleDrafter(Drafter):
    name = "oracle"
    defaults = {"depth": 4, "distractors": 3, "seed": 0, "continuation": None, "prompt_len": 0}

    def __init__(self, target, config=None):
        super().__init__(target, config)
        self.rng = random.Random(self.config["seed"])

    def propose(self, ctx) -> DraftTree:
        truth = self.config["continuation"]
        done = len(ctx.tokens) - self.config["prompt_len"]  # tokens generated so far, root included
        want = truth[done : done + min(self.config["depth"], ctx.max_nodes - 1)]
        vocab = self.target.vocab_size
        tokens, parents = [ctx.root], [-1]
        # Distractor branches under the root, in random order with the true chain.
        depth = self.rng.randint(0, len(want)) if want else 0  # the true chain may be cut short
        chain = want[:depth]
        branches = [("true", chain)] + [("fake", [self.rng.randrange(vocab) for _ in range(self.rng.randint(1, 3))])
                                        for _ in range(self.config["distractors"])]
        self.rng.shuffle(branches)
        for kind, toks in branches:
            par = 0
            for t in toks:
                if kind == "fake" and par == 0 and want and t == want[0]:
                    t = (t + 1) % vocab  # a distractor must not duplicate the true first token
                tokens.append(t)
                parents.append(par)
                par = len(tokens) - 1
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))
