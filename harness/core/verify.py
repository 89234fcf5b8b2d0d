"""Acceptance rules: which path of a verified draft tree to keep, and the bonus token after it.

  greedy    T = 0: the longest path whose every token is the target's argmax; bonus = argmax.
  lossless  T > 0: recursive rejection sampling over siblings (SpecInfer / EAGLE). Deterministic
            (point-mass) drafts are accepted with probability p(x); drafts sampled from a draft
            distribution q are accepted with min(1, p(x)/q(x)); after a rejection the target
            distribution becomes the normalised residual. The output distribution is exactly the
            target's (temperature + top-p) distribution. Unlike the official EAGLE-2 code, the
            bonus token after a fully accepted path is drawn from the *processed* distribution.
  typical   Medusa's typical acceptance (epsilon, alpha): lossy, named as such in every table.

What each rule reads on the host (the target's logits stay on its device): greedy the argmax of
every node ([N+1] ids, one copy per step); lossless the processed distribution of each node it
visits ([V] floats per accepted depth, plus the draft law q of that node when the drafts were
sampled); typical p(x) of every draft and the thresholds ([2N+1] floats) and the bonus node's
distribution ([V]). Draws use the loop's generator, a CPU one, so a seed gives the same draws
on every device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.core.errors import SpecbenchError
from harness.core.rules import check_rule
from harness.core.tree import DraftTree


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    acceptance: str = "greedy"
    typical_epsilon: float = 0.09
    typical_alpha: float = 0.3

    def __post_init__(self) -> None:
        check_rule(self.acceptance, self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise SpecbenchError(f"--top-p must be in (0, 1], got {self.top_p}")


@dataclass
class Verdict:
    """path: accepted node indices, root first (ascending); bonus: the target's next token."""

    path: list[int]
    bonus: int

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def processed_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Target distribution after temperature and top-p (HF warper semantics), float32 [.., V]."""
    scores = logits.float() / temperature
    if top_p < 1.0:
        sorted_scores, idx = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False  # always keep the most likely token
        scores = scores.scatter(-1, idx, sorted_scores.masked_fill(remove, float("-inf")))
    return scores.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from `probs` [V], on the generator's device (the loop's generator is a CPU one)."""
    if generator is not None:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_distinct(probs: torch.Tensor, n: int, generator: torch.Generator | None) -> list[int]:
    """`n` draws from `probs` [V] without replacement, on the generator's device."""
    if generator is not None:
        probs = probs.to(generator.device)
    return torch.multinomial(probs, n, replacement=False, generator=generator).tolist()


def verify(tree: DraftTree, logits: torch.Tensor, sampling: Sampling,
           generator: torch.Generator | None = None) -> Verdict:
    """Apply the sampling's rule to the target logits [N+1, V] of the tree's nodes."""
    if sampling.acceptance == "greedy":
        return verify_greedy(tree, logits)
    if sampling.acceptance == "lossless":
        return verify_lossless(tree, logits, sampling.temperature, sampling.top_p, generator)
    return verify_typical(tree, logits, sampling, generator)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim, first index on ties (as `argmax`). `max().indices` because a
    bf16 `argmax` over a 49k vocab is ~4.7x slower on CPU (11.8 vs 2.5 ms for 32 rows here)."""
    return logits.max(-1).indices


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    top = greedy_tokens(logits).tolist()
    tokens = tree.tokens.tolist()
    node, path, borrowed = 0, [0], False
    while True:
        want = top[node]
        nxt = next((c for c in tree.verify_children(node, borrowed) if tokens[c] == want), None)
        if nxt is None:
            return Verdict(path, want)
        borrowed = borrowed or tree.borrows(node, nxt)
        node = nxt
        path.append(node)


def _renormalise(p: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    s = p.sum()
    if s > 0:
        return p / s
    # A residual is all-zero only through rounding when p == q: keep the previous distribution,
    # so the support (e.g. the top-p set) is never widened.
    return fallback if fallback is not None else torch.full_like(p, 1.0 / p.numel())


def verify_lossless(tree: DraftTree, logits: torch.Tensor, temperature: float, top_p: float,
                    generator: torch.Generator | None) -> Verdict:
    tokens = tree.tokens.tolist()
    node, path, borrowed = 0, [0], False
    p = processed_probs(logits[0], temperature, top_p).cpu()  # the rule reads this row, draft by draft
    while True:
        kids = tree.verify_children(node, borrowed)
        q = tree.q[node].to("cpu", torch.float32, copy=True) if (tree.q is not None and kids) else None
        chosen = None
        for c in kids:
            x = tokens[c]
            before = p
            ratio = p[x] if q is None else p[x] / q[x].clamp_min(1e-30)
            if float(torch.rand((), generator=generator)) < float(ratio):
                chosen = c
                break
            if q is None:  # point mass at x: residual = p without x
                p = p.clone()
                p[x] = 0.0
            else:  # residual max(0, p - q); the next sibling was drawn from q without x
                p = (p - q).clamp_min(0.0)
                q[x] = 0.0
                q = _renormalise(q)
            p = _renormalise(p, before)
        if chosen is None:
            return Verdict(path, sample(p, generator))
        borrowed = borrowed or tree.borrows(node, chosen)
        node = chosen
        path.append(node)
        p = processed_probs(logits[node], temperature, top_p).cpu()


def verify_typical(tree: DraftTree, logits: torch.Tensor, sampling: Sampling,
                   generator: torch.Generator | None) -> Verdict:
    """Medusa's rule: accept x under parent distribution p iff p(x) > min(eps, alpha * exp(-H(p)));
    keep the longest accepted path (ties: largest sum of log p); sample the bonus from p restricted
    to the tokens above the same threshold."""
    probs = (logits.float() / sampling.temperature).softmax(-1)
    entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
    thresh = torch.minimum(torch.full_like(entropy, sampling.typical_epsilon),
                           sampling.typical_alpha * torch.exp(-entropy))
    tokens = tree.tokens.tolist()
    parents = tree.parent_list
    # Every draft's p(x) under its parent and every node's threshold, read in one copy each.
    p_draft = [0.0] + probs[tree.parents[1:].to(probs.device), tree.tokens[1:].to(probs.device)].tolist()
    thresholds = thresh.tolist()
    best, best_key = 0, (0, 0.0)
    depth = {0: 0}
    score = {0: 0.0}
    for c in range(1, len(tokens)):
        par = parents[c]
        if par not in depth:
            continue
        px = p_draft[c]
        if px > thresholds[par]:
            depth[c] = depth[par] + 1
            score[c] = score[par] + float(torch.log(torch.tensor(px)))
            key = (depth[c], score[c])
            if key > best_key:
                best, best_key = c, key
    path = [best]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    path.reverse()
    p = probs[best].cpu()
    keep = p > thresholds[best]
    keep[p.argmax()] = True
    p = _renormalise(p * keep)
    return Verdict(path, sample(p, generator))
