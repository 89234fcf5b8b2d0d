"""Static draft trees fitted to a drafter's own heads (Medusa's recipe).

Medusa's `mc_sim_7b_63` was chosen from the measured top-k accuracies of Vicuna-7B's heads; heads
trained on another target rank differently, so a tree taken from that list wastes nodes. Here the
tree is fitted on held-out distilled answers. At every answer position t (the state where f_t is
the feature of the last accepted token and x_{t+1} the root), each head's rank of the true token
at its depth is measured teacher-forced (Hydra's later heads see the true path, which is the only
path whose nodes can be accepted). Under greedy verification a static tree accepts exactly those of
its nodes whose rank path is a prefix of the true rank row, so

    E[accepted drafts] = sum over tree nodes of P(node's rank path is a prefix of the truth),

and the N most frequent rank prefixes form the best N-node tree (a prefix is at least as frequent
as its extensions, so that set is always a valid tree). τ = 1 + E[accepted drafts].

Only greedy answers are used: acceptance is judged against the target's argmax, and a sampled
answer's next token is not it. A conversation counts as greedy when its answer tokens agree with
the target's argmax at `GREEDY_AGREEMENT` of positions (the distilled greedy answers agree at
~99%: bf16 near-ties; the sampled ones at ~70%).
"""
from __future__ import annotations

from collections import Counter

import torch

from methods.common.draft_vocab import UNREACHABLE

GREEDY_AGREEMENT = 0.95


def truth_ranks(drafter, batch) -> torch.Tensor:
    """[B, T, depth]: at t, the rank of x_{t+1+d} among the depth-d head's drafts (UNREACHABLE
    past the end). `drafter` supplies `teacher_forced_heads(batch)` and `own_proj(k)`."""
    b, t = batch.input_ids.shape
    out = torch.full((b, t, drafter.config["heads"]), UNREACHABLE, dtype=torch.long)
    for k, off, hidden in drafter.teacher_forced_heads(batch):
        out[:, : t - off, k] = drafter.vocab_ranks(hidden, batch.input_ids[:, off:], drafter.own_proj(k)).cpu()
    return out


def greedy_sequences(target, seqs: list) -> list:
    """The conversations whose answers follow the target's argmax (the distilled greedy samples)."""
    keep = []
    for s in seqs:
        h = s.hidden[s.prompt_len - 1 : -1].to(target.device, target.dtype)
        if len(h) == 0:
            continue
        agree = (target.project(h).argmax(-1).cpu() == s.ids[s.prompt_len :]).float().mean()
        if agree >= GREEDY_AGREEMENT:
            keep.append(s)
    return keep


@torch.no_grad()
def rank_table(drafter, seqs: list, max_len: int = 1024, tokens_per_batch: int = 2048) -> torch.Tensor:
    """[N, depth] truth ranks at every answer position of `seqs` whose root is an answer token."""
    from harness.train.data import batches

    was_training = drafter.training
    drafter.eval()
    rows = []
    for batch in batches(seqs, tokens_per_batch, max_len, seed=0, epoch=0):
        batch.features = batch.features.to(drafter.target.device, next(drafter.parameters()).dtype)
        batch.target_features = batch.features
        batch.input_ids = batch.input_ids.to(drafter.target.device)
        ranks = truth_ranks(drafter, batch)
        # state t is used when the root x_{t+1} is an answer token
        root_is_answer = (batch.loss_mask * batch.attention_mask)[:, 1:].bool()
        rows.append(ranks[:, :-1][root_is_answer])
    drafter.train(was_training)
    return torch.cat(rows) if rows else torch.empty(0, drafter.config["heads"], dtype=torch.long)


def prefix_counts(ranks: torch.Tensor, topk: int) -> Counter:
    """How often each rank path (every entry < topk) is a prefix of a truth row."""
    counts: Counter = Counter()
    for row in ranks.tolist():
        path: tuple[int, ...] = ()
        for r in row:
            if r >= topk:
                break
            path = path + (r,)
            counts[path] += 1
    return counts


def ranked_candidates(ranks: torch.Tensor, nodes: int, topk: int = 10) -> list[list]:
    """[[rank path, frequency], ...]: the `nodes` most frequent rank prefixes (ties: shallower,
    then lower ranks), most frequent first, with the share of truth rows each is a prefix of (the
    chance that node is accepted). Every leading run of the list is a valid tree, and the best
    static tree of its size on `ranks`: what a tree sized on a cost curve picks from."""
    counts = prefix_counts(ranks, topk)
    order = sorted(counts, key=lambda p: (-counts[p], len(p), p))
    total = max(len(ranks), 1)
    return [[list(p), round(counts[p] / total, 6)] for p in order[:nodes]]


def accepted_drafts(ranks: torch.Tensor, choices: list[list[int]]) -> torch.Tensor:
    """[N]: drafts a static tree of `choices` gets accepted at each truth row (greedy verification:
    the deepest tree node whose rank path is a prefix of the row)."""
    tree = {tuple(c) for c in choices}
    out = []
    for row in ranks.tolist():
        n = 0
        while n < len(row) and tuple(row[: n + 1]) in tree:
            n += 1
        out.append(n)
    return torch.tensor(out, dtype=torch.long)


def expected_tau(ranks: torch.Tensor, choices: list[list[int]]) -> float:
    """Mean tokens per target forward a static tree of `choices` gets on `ranks` (1 + accepted drafts)."""
    if len(ranks) == 0:
        return float("nan")
    return 1.0 + accepted_drafts(ranks, choices).float().mean().item()
