"""Prompt-lookup decoding (PLD): propose the tokens that followed an earlier occurrence of the
context's last n-gram, as a chain. Training-free.

`match` picks the occurrence: "first" is Saxena's prompt lookup (and Spec-Bench's): the earliest
occurrence whose continuation holds `max_draft` tokens, longest n-gram first; "latest" (ours) the
most recent occurrence, its continuation however short.

The default is Saxena's algorithm. Our variant (`--set pld.adaptive=true --set pld.match=latest`,
labelled in tables) adds a chain length chosen each step to maximise expected new tokens per unit
of verify cost, from
  * the measured cost curve of a k-token forward relative to a 1-token step (`cost_curve`;
    defaults are the `cli.py bench` figures of SmolLM2 on this class of CPU, per dtype), and
  * a running estimate of the per-token acceptance rate for matches of each n-gram length,
    reset for every answer so that results never depend on question order.
A chain of k drafts with per-token acceptance a yields E(k) = (1 - a^(k+1)) / (1 - a) tokens for
cost c(k+1); when no k beats plain decoding (k = 0) it proposes nothing.
"""
from __future__ import annotations

from typing import Any

from harness.core.cost_model import interpolate
from harness.core.errors import SpecbenchError
from harness.core.tree import DraftTree
from methods.common.base import Drafter
from methods.common.config_types import Takes, integer, number

# Relative cost of one cached forward of k tokens vs 1 token (SmolLM2-135M, 2 Sapphire Rapids cores;
# shared/docs/models.md and `cli.py bench`). Override with --set cost_curve='[[1,1.0],[2,1.1],...]'.
COST_CURVES = {
    "float32": [[1, 1.0], [2, 1.06], [4, 1.55], [8, 1.97], [16, 2.09], [32, 2.55], [64, 3.82]],
    "bfloat16": [[1, 1.0], [2, 1.05], [4, 1.08], [8, 1.11], [16, 1.18], [32, 1.29], [64, 1.61]],
    "float16": [[1, 1.0], [2, 1.02], [4, 1.04], [8, 1.06], [16, 1.1], [32, 1.2], [64, 1.4]],
}


def best_chain_length(accept_rate: float, curve: list[list[float]], k_max: int) -> int:
    """The k in 0..k_max maximising E(k) / c(k+1)."""
    a = min(max(accept_rate, 0.0), 0.999)
    best_k, best_v = 0, 1.0 / interpolate(curve, 1)
    expected = 1.0
    for k in range(1, k_max + 1):
        expected += a**k
        v = expected / interpolate(curve, k + 1)
        if v > best_v:
            best_k, best_v = k, v
    return best_k


class PromptLookupDrafter(Drafter):
    """Prompt lookup: a chain copied from the context after the last n-gram's earlier occurrence."""

    name = "pld"
    display_name = "Prompt lookup"
    paper = "Saxena, 2023 (prompt lookup decoding)"
    year = 2023
    color = "#E69F00"
    order = 10
    defaults: dict[str, Any] = {
        "max_ngram": 3,        # longest suffix n-gram looked up (HF's max_matching_ngram_size is 2)
        "min_ngram": 1,
        "max_draft": 10,       # never propose more (HF's prompt_lookup_num_tokens default is 10)
        "adaptive": False,     # True (ours): a cost-aware chain length; False: max_draft tokens, as Saxena's
        "match": "first",      # "first": Saxena's earliest full-length match; "latest" (ours): the most recent
        "cost_curve": "auto",  # "auto" = COST_CURVES[target dtype], or [[k, cost], ...]
        "prior": [0.35, 0.5, 0.65],  # initial acceptance rate for 1-, 2-, 3-gram matches
        "prior_weight": 2.0,   # pseudo-observations behind the prior
        "decay": 0.9,          # forgetting of old evidence per use (tracks the current answer)
    }
    config_types = {"max_ngram": integer(1), "min_ngram": integer(1), "max_draft": integer(1),
                    "cost_curve": Takes(("list",), ("auto",)), "prior_weight": number(0), "decay": number(0, 1)}

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        if self.config["match"] not in ("first", "latest"):
            raise SpecbenchError(f"pld match must be 'first' or 'latest', got {self.config['match']!r}")
        curve = self.config["cost_curve"]
        if curve == "auto":
            curve = COST_CURVES.get(str(target.dtype).replace("torch.", ""), COST_CURVES["float32"])
        self.curve = curve
        self._reset()

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        # A whole config without `match` was recorded before the key existed, when every match was the latest.
        latest = config.get("match", "latest" if "adaptive" in config else "first") != "first"
        return (["adaptive"] if config.get("adaptive") else []) + (["latest match"] if latest else [])

    def _reset(self) -> None:
        n = self.config["max_ngram"]
        prior = list(self.config["prior"]) + [self.config["prior"][-1]] * n
        w = self.config["prior_weight"]
        self.hits = {g: prior[g - 1] * w for g in range(1, n + 1)}
        self.trials = {g: w for g in range(1, n + 1)}
        # n-gram -> where its continuations start, in order (the context's positions)
        self.index: dict[int, dict[tuple[int, ...], list[int]]] = {g: {} for g in range(1, n + 1)}
        self.indexed_upto = 0
        self.last: tuple[int, int] | None = None  # (n-gram length, drafts proposed) of the pending step

    def begin(self, prompt, prefill, root: int) -> None:
        self._reset()

    def _update_index(self, tokens: list[int]) -> None:
        # n-grams ending before the last token: the suffix itself must not match itself.
        end = len(tokens) - 1
        for j in range(max(self.indexed_upto, 1), end + 1):
            for g in self.index:
                if j - g >= 0:
                    self.index[g].setdefault(tuple(tokens[j - g : j]), []).append(j)
        self.indexed_upto = end + 1

    def propose(self, ctx) -> DraftTree:
        tokens = ctx.tokens
        self._update_index(tokens)
        self.last = None
        for g in range(self.config["max_ngram"], self.config["min_ngram"] - 1, -1):
            if len(tokens) <= g:
                continue
            start = self._match(self.index[g].get(tuple(tokens[-g:]), []), len(tokens), g)
            if start is None:
                continue
            cont = tokens[start : start + self.config["max_draft"]]
            k_max = min(len(cont), ctx.max_nodes - 1, self.config["max_draft"])
            if self.config["adaptive"]:
                k = best_chain_length(self.hits[g] / self.trials[g], self.curve, k_max)
            else:
                k = k_max
            if k <= 0:
                return DraftTree.root_only(ctx.root)
            self.last = (g, k)
            return DraftTree.chain(ctx.root, cont[:k])
        return DraftTree.root_only(ctx.root)

    def _match(self, starts: list[int], n: int, g: int) -> int | None:
        """Where the proposed continuation starts, among an n-gram's `starts` in a context of `n` tokens."""
        if self.config["match"] == "latest":
            return starts[-1] if starts else None
        # Saxena's rule: the earliest start with a whole `max_draft`-token continuation, never
        # the suffix itself (its continuation would begin inside the n-gram being matched).
        full = self.config["max_draft"]
        return next((j for j in starts if j + full <= n and j < n - g), None)

    def observe(self, step) -> None:
        if self.last is None:
            return
        g, k = self.last
        decay = self.config["decay"]
        self.hits[g] *= decay
        self.trials[g] *= decay
        # Positions actually tested: the accepted ones, plus the first rejected one if any.
        self.hits[g] += step.accepted
        self.trials[g] += min(k, step.accepted + 1)
