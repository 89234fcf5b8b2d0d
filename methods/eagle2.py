"""EAGLE-2: EAGLE's weights with the dynamic draft tree.

Per cycle: the root pass gives the top-k depth-1 candidates (the first beam); then `depth`
expansion steps: the k beams are fed together (each sees the committed context and its own
chain of ancestor beams: the draft-side tree mask), each proposes its top-k children scored by
cumulative draft log-prob, all k² children are kept as candidates and the top-k of them by score
become the next beam. Finally the pooled candidates (k + depth·k²) are reranked and the best
`total_tokens - 1` kept as the tree. At T > 0 the drafts are deterministic (point-mass) and the
shared verifier applies recursive rejection; its bonus token is drawn from the temperature/top-p
processed distribution (the official code's last bonus skips that processing; ours does not).
"""
from __future__ import annotations

from typing import Any

import torch

from harness.core.tree import DraftTree
from methods.eagle import EagleCore


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


def kept_nodes(keep: list[int], toks: list[int], parents: list[int], scores: list[float],
               max_nodes: int) -> list[dict]:
    """Reranked candidates as nodes {tok, parent (node index, -1 = root), score, depth}, dropping
    those deeper than the answer's remaining token budget (and so their descendants)."""
    index: dict[int, int] = {}
    nodes: list[dict] = []
    for c in keep:
        par = parents[c]
        if par != -1 and par not in index:
            continue  # its parent was cut by the depth limit below
        depth = 1 if par == -1 else nodes[index[par]]["depth"] + 1
        if depth > max_nodes - 1:
            continue
        index[c] = len(nodes)
        nodes.append({"tok": toks[c], "parent": -1 if par == -1 else index[par], "score": scores[c], "depth": depth})
    return nodes


def build_tree(root: int, nodes: list[dict]) -> DraftTree:
    tokens = [root] + [n["tok"] for n in nodes]
    parents = [-1] + [n["parent"] + 1 for n in nodes]
    return DraftTree(torch.tensor(tokens), torch.tensor(parents),
                     scores=torch.tensor([0.0] + [n["score"] for n in nodes]))


class Eagle2(EagleCore):
    """EAGLE-2: EAGLE's draft head with the dynamic (beam + rerank) tree."""

    name = "eagle2"
    weights_from = "eagle"
    defaults: dict[str, Any] = {
        **EagleCore.defaults,
        # CPU default: verifying 32 tokens costs ~1.3x a 1-token step in bf16 here (64: ~1.6x),
        # and a draft step ~4 ms against ~41 ms for the target; with heads trained on ~1 M tokens
        # the extra nodes of a 60-token tree rarely pay. Official: top_k 10, depth 5, total 60.
        "top_k": 8,
        "depth": 4,
        "total_tokens": 32,
    }

    @torch.inference_mode()
    def propose(self, ctx) -> DraftTree:
        k = self.config["top_k"]
        depth = min(self.config["depth"], ctx.max_nodes - 2)
        dev = self.target.device
        committed = self._cache.length
        # Candidate pool: token, cumulative score, parent candidate (-1 = root), cached tree row.
        top_score, top_tok = self.draft_topk(self._last, k)
        cand_tok = top_tok.tolist()
        cand_score = top_score.tolist()
        cand_parent = [-1] * k
        beam = list(range(k))                  # candidate ids of the current beam
        beam_feat = self._last.expand(k, -1)   # output of each beam's parent
        anc_rows: dict[int, list[int]] = {-1: []}
        n_rows = 0
        for step in range(max(0, depth)):
            toks = torch.tensor([cand_tok[c] for c in beam], device=dev)
            mask = self.tree_mask(committed, [anc_rows[cand_parent[c]] for c in beam], n_rows)
            pos = torch.full((len(beam),), committed + step, device=dev)
            out = self.draft_forward(toks, beam_feat, pos, mask)
            for j, c in enumerate(beam):
                anc_rows[c] = anc_rows[cand_parent[c]] + [n_rows + j]
            n_rows += len(beam)
            child_score, child_tok = self.draft_topk(out, k)            # [beams, k]
            cu = torch.tensor([cand_score[c] for c in beam])[:, None] + child_score.cpu()
            first = len(cand_tok)
            cand_tok.extend(child_tok.flatten().tolist())
            cand_score.extend(cu.flatten().tolist())
            cand_parent.extend(c for c in beam for _ in range(k))
            best = torch.topk(cu.flatten(), min(k, cu.numel())).indices.tolist()
            beam = [first + b for b in best]
            beam_feat = out[[b // k for b in best]]
        self._cache.crop_to(committed)
        self.last_pool_size = len(cand_tok)  # k + depth * k^2 (tests check it)
        keep = rerank(torch.tensor(cand_score), cand_parent, self.config["total_tokens"] - 1)
        return build_tree(ctx.root, kept_nodes(keep, cand_tok, cand_parent, cand_score, ctx.max_nodes))
