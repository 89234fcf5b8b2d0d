"""Lookahead decoding (Fu et al., ICML 2024): Jacobi iteration over a window of guessed tokens
grows a pool of n-grams, and the pool's n-grams that start with the root are verified; both
branches run in the same target forward. Training-free.

The algorithm and its settings are those of Spec-Bench's runner (`evaluation/inference_lookahead.py`
with `model/lade`: level N = 3, window W = 10, guess set G = 10; its `eval.sh` ran the leaderboard
with N = 5, W = 7, G = 7: `--set lookahead.level=5 --set lookahead.window=7 --set lookahead.guess=7`):
  * The window holds N-1 levels of W guesses each (level 0 one shorter). In every verify forward
    each window token is a side row (harness/core/tree.py: `SideRows`): level 0 is a causal run
    after the root, and the token of level l in column j sees the root, level 0's tokens before
    column j and the column-j tokens of levels 1..l. Its position is the root's plus l + j (level
    0: plus 1 + j). The argmax of the last level's rows is that level's next Jacobi iterate.
  * Column j's trajectory makes an n-gram: its level-0 token (the root for column 0) is the key,
    the column's tokens of levels 1..N-2 and the new iterate follow. Each key keeps at most G
    n-grams; an n-gram seen again moves to the back, a new one beyond G drops the oldest.
  * The window then moves one column, whatever was accepted: level 0 takes level 1 without its
    first token, each level takes the next one, the last level takes the new iterates.
  * At the start the window is W + N - 3 tokens drawn from the prompt (Python's `random` seeded
    10, as the official code does for every answer); they run in the prefill's forward after the
    prompt (`prefill_rows`), which gives level 1; levels 2..N-2 fill over the next N - 3 steps,
    which verify no drafts.
  * Every n-gram the pool holds under the root is verified. The official match loop stops one
    token short (lade/decoding.py: `gg` ends at N-2 when all N-1 tokens match), so only an
    n-gram's first N-2 tokens can be accepted and its last token's row is never read: ours drafts
    those N-2 tokens only (`full_ngram=True` drafts all N-1), merged into one trie. Same tokens,
    same accept lengths at T = 0, fewer rows.
Elsewhere ours differs from the official code where no token can change: drafts are cut to the
answer's remaining room (the official step may overshoot the token limit and be trimmed), and a
tree budget (`max_drafts`, what `--tree-budget` sets) can cap the verified draft nodes, n-grams
added freshest first while they fit; the pool and the window are not sized by it. A record's
`tree_size` counts the verified draft nodes, not the window's rows.
At T > 0 the drafts are point masses (q = None) verified by the shared lossless rule, so the
output follows the target's law; the window advances by argmax at every temperature. Spec-Bench's
copy decodes greedily only (its runner passes do_sample=False; only greedy search is patched); the
original repository's sampling path (hao-ai-lab/LookaheadDecoding) also fills the window by argmax
and accepts an argmax draft x with probability p(x), removing x from p after a rejection, which is
the same lossless rule.
"""
from __future__ import annotations

import random
from dataclasses import replace
from functools import lru_cache
from typing import Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.tree import DraftTree, SideRows
from harness.core.tree_build import trie_tree
from methods.common.base import Drafter

INIT_SEED = 10  # the official code seeds Python's `random` with 10 before drawing the window


@lru_cache(maxsize=64)
def window_layout(sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets [S], mask [S, S]) of a window whose levels hold `sizes` tokens, laid out level by
    level: level 0 (L0 tokens) at offsets 1..L0 from the root, causal; level l >= 1 (L0 + 1 tokens)
    at offsets l..l+L0, its column-j token seeing level 0's tokens before column j and the column-j
    tokens of levels 1..l. Every row also sees the root (a column of the tree, not of this block)."""
    first = [sum(sizes[:lv]) for lv in range(len(sizes))]
    total = sum(sizes)
    mask = torch.zeros(total, total, dtype=torch.bool)
    mask[: sizes[0], : sizes[0]] = torch.ones(sizes[0], sizes[0], dtype=torch.bool).tril()
    offsets = list(range(1, sizes[0] + 1))
    for lv in range(1, len(sizes)):
        for j in range(sizes[lv]):
            row = first[lv] + j
            mask[row, :j] = True
            for up in range(1, lv + 1):
                mask[row, first[up] + j] = True
        offsets += range(lv, lv + sizes[lv])
    return torch.tensor(offsets, dtype=torch.long), mask


def window_rows(levels: list[list[int]], tree_nodes: int) -> SideRows:
    """The window's side rows beside a tree of `tree_nodes` draft nodes: they see the root, no
    draft node, and the window rows `window_layout` says."""
    offsets, block = window_layout(tuple(len(lv) for lv in levels))
    mask = torch.zeros(block.shape[0], 1 + tree_nodes + block.shape[0], dtype=torch.bool)
    mask[:, 0] = True
    mask[:, 1 + tree_nodes:] = block
    return SideRows(torch.tensor([t for lv in levels for t in lv]), offsets, mask)


def remember(grams: list[tuple[int, ...]], gram: tuple[int, ...], capacity: int) -> None:
    """Put `gram` at the back of one key's n-grams: moved there if present, else appended, the
    oldest dropped beyond `capacity`."""
    if gram in grams:
        grams.remove(gram)
    elif len(grams) >= capacity:
        del grams[0]
    grams.append(gram)


class Lookahead(Drafter):
    """Lookahead decoding: n-grams from a Jacobi window, verified beside it in one forward."""

    name = "lookahead"
    display_name = "Lookahead"
    paper = "Fu et al., ICML 2024"
    year = 2024
    color = "#56B4E9"
    order = 15
    resumable = False  # the window and the pool come from earlier forwards, not from the context
    defaults: dict[str, Any] = {
        "window": 10,          # W: columns of the Jacobi window (Spec-Bench runner --window)
        "level": 3,            # N: n-gram size; the window keeps N-1 levels (--level)
        "guess": 10,           # G: n-grams kept per key token, the oldest dropped first (--guess)
        "full_ngram": False,   # draft all N-1 tokens of an n-gram; False: the first N-2, as the official match loop
        "max_drafts": None,    # at most this many draft nodes per verify (the tree budget); None: all n-grams
    }

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        cfg = self.config
        for key, low in (("window", 1), ("level", 3), ("guess", 1)):
            if not isinstance(cfg[key], int) or cfg[key] < low:
                raise SpecbenchError(f"lookahead: {key}={cfg[key]!r} must be an integer >= {low}, "
                                     f"e.g. --set lookahead.{key}={self.defaults[key]}")
        if cfg["max_drafts"] is not None and (not isinstance(cfg["max_drafts"], int) or cfg["max_drafts"] < 1):
            raise SpecbenchError(f"lookahead: max_drafts={cfg['max_drafts']!r} must be a positive integer or null")
        self.levels: list[list[int]] = []
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.step_root: int | None = None

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """A budget caps the verify branch's draft nodes (n-grams are added freshest first while
        they fit); the window and the pool are not sized by it. "auto": as configured."""
        return {} if budget == "auto" else {"max_drafts": int(budget)}

    @property
    def filled(self) -> bool:
        """Whether every level of the window holds guesses (drafts are verified from then on)."""
        return len(self.levels) == self.config["level"] - 1

    def initial_window(self, prompt: list[int]) -> list[int]:
        """Level 0 before the prefill: W + N - 3 tokens drawn from the prompt."""
        rng = random.Random(INIT_SEED)
        return [rng.choice(prompt) for _ in range(self.config["window"] + self.config["level"] - 3)]

    def prefill_rows(self, prompt: torch.Tensor) -> SideRows:
        """The initial level 0, run causally after the prompt in the prefill's forward."""
        return window_rows([self.initial_window(prompt.tolist())], 0)

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        """A new answer: an empty pool, and the window's level 1 from the prefill's side rows."""
        if prefill.side_logits is None:
            raise ValueError("lookahead needs the prefill's side rows: prefill through harness.core.decode.prefill")
        start = self.initial_window(prompt.tolist())
        self.levels = [start[1:], prefill.side_logits.argmax(-1).tolist()]
        self.pool = {}
        self.step_root = None

    def propose(self, ctx) -> DraftTree:
        """The pool's n-grams under the root as a trie (once the window is filled), and the window."""
        self.step_root = ctx.root
        grams = self.pool.get(ctx.root, []) if self.filled else []
        keep = self.config["level"] - (1 if self.config["full_ngram"] else 2)
        tree = trie_tree(ctx.root, [g[:keep] for g in reversed(grams)], ctx.max_nodes - 1, self.config["max_drafts"])
        return replace(tree, side=window_rows(self.levels, tree.size))

    def observe(self, step) -> None:
        """The last level's next iterates: fill the window, or (filled) add the n-grams of every
        column to the pool and move the window one column."""
        last = len(self.levels[-1])
        new = step.side_logits[-last:].argmax(-1).tolist()
        if not self.filled:
            self.levels = [lv[1:] for lv in self.levels] + [new[1:]]
            return
        keys = [self.step_root] + self.levels[0]
        for j, key in enumerate(keys[:last]):
            gram = tuple(lv[j] for lv in self.levels[1:]) + (new[j],)
            remember(self.pool.setdefault(key, []), gram, self.config["guess"])
        self.levels = [self.levels[1][1:], *self.levels[2:], new]
