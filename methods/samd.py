"""SAM-Decoding (Hu et al., ACL 2025): drafts by suffix automata. A dynamic automaton over the prompt
and the text generated so far, and a static one over a corpus, each find the longest suffix of
the context (the root included) that occurred before; the tokens after its first occurrence are
the draft. When neither match is long enough an auxiliary drafter proposes instead
(`aux`: recycling, eagle2, any method, or none).

The selection, as the official code (Spec-Bench model/samd): with an auxiliary, the static
match counts `len_bias` tokens less; if the longer of the two reaches `len_threshold`, the draft
is a chain of `n_predicts - 1` tokens after the first occurrence of the longer match (the
dynamic one on a tie), where a dynamic match whose first occurrence leaves fewer tokens than
that is shortened (its suffix link) to one that occurred earlier; otherwise the auxiliary's tree.
Without one: the dynamic match (if not shorter) gives a chain of min(n_predicts - 1,
alpha * length) tokens; else the static one a tree, grown best-first by the corpus frequency
of each continuation (at most `static_topk` children per node and nodes per depth).

The dynamic automaton is a suffix automaton in Python (linear in the answer); the static one is
the token index of REST's datastore (methods/common/token_index.py): a suffix array answers the
same questions (the longest suffix match, its first occurrence, the frequency of each next
token) for the few million tokens of the default corpus, where a pickled Python automaton
would take gigabytes. Choices of ours: chains stop at the end of the text (the official code
pads them with token 0); a corpus document's end ends a static chain; an answer starts fresh
(both matches, and the auxiliary's own state by its `begin`).

The auxiliary is built here from its name (methods/common/method_lookup.py: the registry's
lookup, since a method file imports no other method) with its own defaults, `aux_config` over
them, and `budget` (`--tree-budget`) passed on as its own tree budget; it observes every step,
whoever drafted it, so its state follows the text (EAGLE-2's draft cache; Token Recycling
learns from every verified node). All drafts are deterministic, or the auxiliary's own (its q
passes through): the shared verifier is lossless at T > 0.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.packed_linear import weight_format
from harness.core.tree import DraftTree, tree_from_parent_map
from methods.common.base import Drafter
from methods.common.config_types import Takes, integer, number
from methods.common.method_lookup import method_class
from methods.common.token_index import TokenIndex, load_datastore

if TYPE_CHECKING:
    from harness.core.decode import Acceptance, DraftContext


class SuffixAutomaton:
    """The suffix automaton of a growing token list: a state per class of substrings that end at
    the same positions; `first_end[s]` is where the first occurrence of state s's strings ends."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.first_end = [-1]
        self.last = 0  # the state of the whole text

    def _state(self, length: int, first_end: int, nxt: dict[int, int] | None = None, link: int = -1) -> int:
        self.next.append(dict(nxt or {}))
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append one token (the classic online construction)."""
        end = len(self.tokens)
        self.tokens.append(token)
        cur = self._state(self.length[self.last] + 1, end)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._state(self.length[p] + 1, self.first_end[q], self.next[q], self.link[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def match_after(self, token: int) -> tuple[int, int]:
        """(state, length) of the longest suffix of tokens + [token] that occurs in tokens; (0, 0)
        when even `token` never occurred. Every state on the whole text's suffix-link path holds
        suffixes of the text, so the first that continues with `token` gives the longest."""
        p = self.last
        while p != -1 and token not in self.next[p]:
            p = self.link[p]
        if p == -1:
            return 0, 0
        return self.next[p][token], self.length[p] + 1

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to n tokens after the first occurrence of `state`'s strings."""
        start = self.first_end[state] + 1
        return self.tokens[start : start + n]

    def earlier(self, state: int, n: int) -> int:
        """The official `to_anc`: while the first occurrence leaves fewer than n tokens after it,
        a shorter match (the suffix link) that first occurred earlier, never the empty one."""
        while state != 0 and self.link[state] != 0 and len(self.tokens) - 1 - self.first_end[state] < n:
            state = self.link[state]
        return state


class SamDecoding(Drafter):
    """SAM-Decoding: the longest suffix match in a dynamic and a static suffix automaton, else an auxiliary drafter."""

    name = "samd"
    display_name = "SAM-Decoding"
    paper = "Hu et al., ACL 2025 (arXiv 2411.10666)"
    year = 2025
    color = "#AA4499"
    order = 17
    defaults: dict[str, Any] = {
        "aux": "recycling",      # auxiliary drafter for short matches: a method name, or "none"
        "aux_config": {},        # its config keys over its defaults, e.g. {"keep_across_answers": true}
        "corpus": "default",     # the static automaton's datastore (`cli.py datastore build`), a folder, or "none"
        "n_predicts": 40,        # chain length counting the root (the official `samd_n_predicts`)
        "len_threshold": 5,      # a match this long drafts instead of the auxiliary
        "len_bias": 5,           # the static match counts this much less (with an auxiliary)
        "alpha": 4.0,            # without an auxiliary: draft min(n_predicts - 1, alpha * match) tokens
        "static_topk": 8,        # without an auxiliary: children per node and nodes per depth of the static tree
        "budget": None,          # draft tokens per verify (--tree-budget): caps the chain, the tree and the auxiliary
    }
    config_types = {"n_predicts": integer(2), "len_threshold": integer(0), "len_bias": integer(0),
                    "alpha": number(0), "static_topk": integer(1), "budget": Takes(("int", "null"), ("auto",), 1)}

    def __init__(self, target, config: dict[str, Any] | None = None, aux: Drafter | None = None) -> None:
        super().__init__(target, config)
        corpus = self.config["corpus"]
        self.index: TokenIndex | None = None if corpus in (None, "none") else load_datastore(str(corpus), target)
        self.aux = aux if aux is not None else self.build_aux()
        self.sam = SuffixAutomaton()
        self.static = (0, 0, 0)

    def build_aux(self) -> Drafter | None:
        """The auxiliary drafter the config names, built as a run builds that method (found weights)."""
        name = self.config["aux"]
        if name in (None, "none"):
            return None
        if name == self.name:
            raise SpecbenchError("samd.aux=samd: the auxiliary must be another method (recycling, eagle2, ...)")
        cls = method_class(str(name))
        budget = self.config["budget"]
        overrides = {**(cls.budget_overrides(budget) if budget is not None else {}), **dict(self.config["aux_config"])}
        return cls.create(self.target, overrides)

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        """The selection rule and the automata are the paper's; the auxiliary's own departures
        (e.g. Token Recycling's per-answer matrix) are said, marked "aux"."""
        name = config.get("aux", "none")
        if name in (None, "none") or name == cls.name:
            return []
        aux = method_class(str(name))
        return [f"aux {d}" for d in aux.departures(aux.resolve_config(dict(config.get("aux_config") or {})))]

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        return {"budget": budget}

    def chain_limit(self) -> int:
        """Draft tokens of a chain: n_predicts - 1, at most the budget."""
        n = int(self.config["n_predicts"]) - 1
        budget = self.config["budget"]
        return n if budget in (None, "auto") else min(n, int(budget))

    def checkpoint_hash(self) -> str | None:
        return self.aux.checkpoint_hash() if self.aux is not None else None

    def target_layers(self) -> list[int]:
        return self.aux.target_layers() if self.aux is not None else []

    def aux_weights(self) -> weight_format:
        return weight_format(self.aux.config.get("weights") if self.aux is not None else None)

    # ---- the decoding protocol ----------------------------------------------------------------
    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        self.sam = SuffixAutomaton()
        self.static = self.index.empty_match() if self.index is not None else (0, 0, 0)
        if self.aux is not None:
            with self.aux_weights():
                self.aux.begin(prompt, prefill, root)

    def sync(self, committed: list[int]) -> None:
        """Both automata read the committed tokens they have not seen (the root is not committed)."""
        for i in range(len(self.sam.tokens), len(committed)):
            self.sam.extend(committed[i])
            if self.index is not None:
                self.static = self.index.extend_match(self.static, committed[i - self.static[0] : i + 1])

    def propose(self, ctx: DraftContext) -> DraftTree:
        self.sync(ctx.tokens[:-1])
        room = ctx.max_nodes - 1
        dyn_state, dyn_len = self.sam.match_after(ctx.root)
        static = self.index.extend_match(self.static, ctx.tokens) if self.index is not None else (0, 0, 0)
        if self.aux is not None:
            static_len = static[0] - int(self.config["len_bias"])
            if max(dyn_len, static_len) < int(self.config["len_threshold"]):
                with self.aux_weights():
                    return self.aux.propose(ctx)
            n = min(self.chain_limit(), room)
            if dyn_len >= static_len:
                drafts = self.sam.continuation(self.sam.earlier(dyn_state, n), n)
            else:
                drafts = self.static_chain(static, n)
            return DraftTree.chain(ctx.root, drafts)
        alpha = float(self.config["alpha"])
        if dyn_len >= static[0]:
            n = min(self.chain_limit(), int(alpha * dyn_len), room)
            return DraftTree.chain(ctx.root, self.sam.continuation(dyn_state, n))
        return self.static_tree(ctx.root, static, min(self.chain_limit(), int(alpha * static[0]), room))

    def observe(self, step: Acceptance) -> None:
        if self.aux is not None:
            with self.aux_weights():
                self.aux.observe(step)

    # ---- the static automaton's drafts -----------------------------------------------------------
    def static_chain(self, match: tuple[int, int, int], n: int) -> list[int]:
        """n tokens after the first occurrence of the static match in the corpus."""
        length, lo, hi = match
        return self.index.continuation(self.index.first_start(lo, hi) + length, n)

    def static_tree(self, root: int, match: tuple[int, int, int], n: int) -> DraftTree:
        """Up to n nodes grown best-first from the static match by the corpus frequency of each
        continuation (a child's probability: its count over its parent's), at most `static_topk`
        children per node and nodes per depth (the official `gen_dyn_draft`)."""
        k = int(self.config["static_topk"])
        tokens: list[int] = []
        parents: list[int] = []
        per_depth: dict[int, int] = {}
        # (-probability, insertion order, token, parent node (0 = root), depth, interval)
        heap = [(-1.0, 0, root, -1, 0, match)]
        pushed = 1
        while heap and len(tokens) < n + 1:
            neg_p, _, token, parent, depth, (length, lo, hi) = heapq.heappop(heap)
            if per_depth.get(depth, 0) >= k:
                continue
            per_depth[depth] = per_depth.get(depth, 0) + 1
            node = len(tokens)
            tokens.append(token)
            parents.append(parent)
            for t, count in self.index.next_tokens(lo, hi, length, k):
                lo2, hi2 = self.index.narrow(lo, hi, length, t)
                heapq.heappush(heap, (neg_p * count / (hi - lo), pushed, t, node, depth + 1, (length + 1, lo2, hi2)))
                pushed += 1
        return tree_from_parent_map(root, tokens[1:], parents[1:])
