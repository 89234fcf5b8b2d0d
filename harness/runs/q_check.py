"""The draft law a drafter reports (`DraftTree.q`), tested without the target's acceptance: the
`q` check of `cli.py check-method`.

At T > 0 the verifier accepts a draft x with min(1, p(x) / q(x)) and after a rejection samples from
the residual max(0, p - q) (harness/core/verify.py): the output keeps the target's law only when
each drafted token really was drawn from the q its tree reports (q None: a point mass on it). So,
from fixed drafter states (`begin` on a context of the card's greedy answers), the drafter proposes
`draws` times at each temperature of Q_TEMPERATURES, its generator seeded s for draw s:
  - a tree that reports q: every drafted child becomes a randomised PIT value under the law it was
    drawn from (its parent's row, without its earlier siblings: siblings are drawn without
    replacement); those values are U(0, 1) exactly when the contract holds, whatever q is. The
    values of each (temperature, depth) are tested for uniformity (harness/runs/law_check.py),
    Bonferroni over the tests. A draft whose q is 0 fails at once.
  - a tree that reports none claims a point mass: `begin` again and another seed must give the
    very same tree (POINT_MASS_DRAWS times per state and temperature).
What the target does with the drafts plays no part, so the check has the same power whether a
drafter's drafts are accepted or not. It cannot see a q that is right in the states and at the
temperatures it draws from and wrong elsewhere (other contexts, top-p < 1, T outside the three),
a lie smaller than the power it states, or a point-mass drafter whose tree depends on something
other than its state and the generator (the clock, say) in a way two draws do not show.
"""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from harness.core.decode import DraftContext, drafting_weights, prefill_forward
from harness.core.target import Target
from harness.core.tree import DraftTree
from harness.core.verify import Sampling
from harness.runs.law_check import detectable_shift, pit, uniformity_test
from harness.runs.law_sampling import ALPHA_FAIR
from harness.runs.tree_contract import same_tree, token_paths

Q_TEMPERATURES = (0.5, 1.0, 1.5)  # the temperatures the methods are run at
POINT_MASS_DRAWS = 4   # draws per state and temperature of a drafter that reports no q
MIN_TESTED = 20        # PIT values a (temperature, depth) needs to be tested
ROOM = 127             # the room of a 128-token answer: the drafter's full tree


@dataclass
class QFindings:
    """What the draws showed: PIT values per (temperature, depth), trees with q, the first problem."""

    pits: dict[tuple[float, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    with_q: int = 0
    states: int = 0
    problem: str = ""


class DrafterState:
    """A drafter started on a context (prompt, then its root last) as a new answer: the target's
    prefill of the prompt is made once, `begin` can be repeated on it."""

    def __init__(self, target: Target, drafter, context: list[int]) -> None:
        self.drafter, self.context = drafter, list(context)
        self.prompt = torch.tensor(context[:-1])
        with torch.inference_mode():
            cache = target.new_cache(capacity=len(context) + 8)
            self.prefill = prefill_forward(target, cache, self.prompt, drafter)

    @torch.inference_mode()
    def begin(self) -> None:
        with drafting_weights(self.drafter):
            self.drafter.begin(self.prompt, self.prefill, self.context[-1])

    @torch.inference_mode()
    def propose(self, sampling: Sampling, seed: int, budget: int | None) -> DraftTree:
        ctx = DraftContext(list(self.context), self.context[-1], sampling, torch.Generator().manual_seed(seed),
                           ROOM, budget)
        with drafting_weights(self.drafter):
            return self.drafter.propose(ctx)


def tree_pits(tree: DraftTree, rng: random.Random) -> tuple[list[tuple[int, float]], str]:
    """(depth, PIT value) of every drafted child of a tree that reports q, and a problem ("" if
    none): a child drawn where its law gives it nothing. Trees the tree contract rejects (parent
    order, q's shape) are left to it."""
    q = tree.q
    if token_paths(tree) is None or q is None or tuple(q.shape) != (tree.tokens.numel(), q.shape[-1]):
        return [], ""
    tokens, depths = tree.tokens.tolist(), tree.depths.tolist()
    q = q.detach().to("cpu", torch.float64)
    out = []
    for node, kids in enumerate(tree.children):
        row = q[node].clone()
        for c in kids:
            total = float(row.sum())
            if not 0 <= tokens[c] < row.numel() or total <= 0 or float(row[tokens[c]]) <= 0:
                return out, (f"node {c} (depth {depths[c]}) drafts token {tokens[c]}, which its parent's q "
                             f"(without the earlier siblings) gives probability 0")
            out.append((depths[c], pit(row / total, tokens[c], rng.random())))
            row[tokens[c]] = 0.0  # the next sibling is drawn without this one
    return out, ""


def draw(target: Target, drafter, contexts: list[list[int]], draws: int, budget: int | None,
         seed: int = 0) -> QFindings:
    """Every temperature's draws from every state; stops at the first problem."""
    found = QFindings(states=len(contexts))
    rng = random.Random(seed)
    for context in contexts:
        state = DrafterState(target, drafter, context)
        for t in Q_TEMPERATURES:
            sampling = Sampling(t, 1.0, "lossless")
            state.begin()
            first = state.propose(sampling, 0, budget)
            if first.q is None:
                for s in range(1, POINT_MASS_DRAWS):
                    state.begin()
                    again = state.propose(sampling, s, budget)
                    if again.q is not None or not same_tree(first, again):
                        found.problem = (f"at T={t:g} the same state gave another tree at seed {s} than at seed 0 "
                                         f"({first.tokens[1:].tolist()[:6]} vs {again.tokens[1:].tolist()[:6]}), "
                                         "but the tree reports no q: drafts drawn at random must carry the law "
                                         "they were drawn from (DraftTree.q)")
                        return found
                continue
            for s in range(draws):
                tree = first if s == 0 else state.propose(sampling, s, budget)
                if tree.q is None:
                    found.problem = (f"at T={t:g} the same state reports q at seed 0 but not at seed {s}: "
                                     "a tree without q claims a point mass")
                    return found
                found.with_q += 1
                values, problem = tree_pits(tree, rng)
                if problem:
                    found.problem = f"at T={t:g}, {problem}"
                    return found
                for depth, u in values:
                    found.pits[(t, depth)].append(u)
    return found


def verdict(found: QFindings) -> tuple[str, str]:
    """(status, detail) of the q row from the draws."""
    if found.problem:
        return "fail", f"draft law: {found.problem}"
    if not found.with_q:
        return "pass", (f"no q (point-mass drafts): at T = {', '.join(f'{t:g}' for t in Q_TEMPERATURES)} each of "
                        f"{found.states} states gave one tree over {POINT_MASS_DRAWS} seeds and fresh begins")
    tests = {k: v for k, v in found.pits.items() if len(v) >= MIN_TESTED}
    if not tests:
        return "fail", (f"draft law: {found.with_q} trees with q, but no temperature and depth has {MIN_TESTED} "
                        "drafted tokens to test")
    alpha = ALPHA_FAIR / len(tests)
    results = {k: uniformity_test(v) for k, v in tests.items()}
    (t, d), (stat, df, p) = min(results.items(), key=lambda kv: kv[1][2])
    depths = sorted({d for _, d in tests})
    smallest = min(len(v) for v in tests.values())
    what = (f"{found.with_q} trees with q from {found.states} states at T = "
            f"{', '.join(f'{x:g}' for x in Q_TEMPERATURES)}; drafted tokens at depths {depths[0]}-{depths[-1]} "
            f"in {len(tests)} (T, depth) tests of {smallest}-{max(len(v) for v in tests.values())} each")
    if p < alpha:
        return "fail", (f"draft law: at T={t:g}, depth {d} the drafted tokens do not follow the q the tree reports "
                        f"(PIT chi2 {stat:.1f} on {df} df, p = {p:.2g} < {alpha:.2g}; {len(tests[(t, d)])} tokens); "
                        f"{what}")
    return "pass", (f"{what}: each uniform under its q (smallest p = {p:.2g}, level {alpha:.2g}); "
                    f"80% power against moving {detectable_shift(smallest, alpha):.0%} of a law's mass "
                    "between PIT bins in the smallest test")
