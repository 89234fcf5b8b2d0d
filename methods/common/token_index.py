"""A suffix-array index over a token corpus: REST's datastore and SAM-Decoding's static automaton.

Both methods ask the same questions of a fixed corpus: which continuations follow the longest
suffix of the context that occurs in it (REST: the first `max_matches` occurrences, counted into
a trie), where that suffix first occurs (SAM-Decoding: the continuation after its first end
position), and which tokens follow it how often (SAM-Decoding's static tree). A suffix array
answers all three with binary searches: the occurrences of a pattern are one interval of the
sorted suffixes, the interval of `pattern + t` is a sub-interval of it, and within an interval
the suffixes are sorted by their next token. So the index is two int32 arrays: the corpus (its
documents separated by SEPARATOR, which no query holds, so no match or continuation crosses a
document boundary) and its suffix array, built by prefix doubling in numpy (seconds for the
few million tokens of the default corpus on one core).

A built index is a folder: tokens.npy, suffixes.npy and meta.json (what it was built from, the
tokenizer's vocabulary hash, the arrays' SHA-256); `load` checks all three, so a missing, torn or
foreign index is one error line naming the command that builds it.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import SpecbenchError

SEPARATOR = -1      # between documents; never a token id
FORMAT = "specbench-token-index/1"


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """[N] int32 start positions of the suffixes of `tokens` [N] in lexicographic order (a suffix
    that is a prefix of another sorts first). Prefix doubling: each round sorts the suffixes by
    their first 2k tokens from the ranks of their first k, until every rank is distinct."""
    n = tokens.size
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64).reshape(-1) + 1  # 0: past the end
    order = np.argsort(rank, kind="stable")
    k = 1
    while int(rank.max()) < n:
        after = np.zeros(n, dtype=np.int64)
        if k < n:
            after[: n - k] = rank[k:]
        key = rank * (n + 1) + after
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(np.concatenate(([1], sorted_key[1:] != sorted_key[:-1])))
        k *= 2
    return order.astype(np.int32)


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class TokenIndex:
    """The corpus `tokens` [N] (documents joined by SEPARATOR) and its suffix array `suffixes` [N]."""

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, meta: dict[str, Any] | None = None) -> None:
        self.tokens = tokens
        self.suffixes = suffixes
        self.meta = meta or {}
        self.size = int(tokens.size)

    # ---- building, saving, loading ----------------------------------------------------------
    @classmethod
    def build(cls, documents: Iterable[Sequence[int]], meta: dict[str, Any] | None = None) -> "TokenIndex":
        """The index of `documents` (token id lists; empty ones are skipped)."""
        parts: list[np.ndarray] = []
        count = 0
        for doc in documents:
            arr = np.asarray(doc, dtype=np.int32).reshape(-1)
            if arr.size:
                parts += [arr, np.array([SEPARATOR], dtype=np.int32)]
                count += 1
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return cls(tokens, suffix_array(tokens), {**(meta or {}), "documents": count, "tokens": int(tokens.size)})

    def save(self, folder: Path) -> None:
        """Write the folder; meta.json last, so a folder without it (an interrupted build) never loads."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)
        for name, arr in (("tokens", self.tokens), ("suffixes", self.suffixes)):
            tmp = folder / f".{name}.{os.getpid()}.npy"
            np.save(tmp, arr)
            os.replace(tmp, folder / f"{name}.npy")
        meta = {**self.meta, "format": FORMAT, "sha256": _digest(self.tokens, self.suffixes)}
        tmp = folder / f".meta.{os.getpid()}.json"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp, folder / "meta.json")
        self.meta = meta

    @classmethod
    def load(cls, folder: Path, vocab_hash: str | None = None, hint: str = "") -> "TokenIndex":
        """The index in `folder`, checked: its files, its format, its checksum and (if given) that
        it was built with the tokenizer of `vocab_hash`. Any failure is one SpecbenchError line."""
        fix = f"; {hint}" if hint else ""
        meta_file = folder / "meta.json"
        if not meta_file.is_file():
            raise SpecbenchError(f"no datastore at {folder}{fix}")
        try:
            meta = json.loads(meta_file.read_text())
            tokens = np.load(folder / "tokens.npy", allow_pickle=False)
            suffixes = np.load(folder / "suffixes.npy", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise SpecbenchError(f"datastore {folder} is unreadable ({type(e).__name__}: {e}){fix}") from None
        if (not isinstance(meta, dict) or meta.get("format") != FORMAT or tokens.dtype != np.int32
                or suffixes.dtype != np.int32 or tokens.shape != suffixes.shape or tokens.ndim != 1
                or meta.get("sha256") != _digest(tokens, suffixes)):
            raise SpecbenchError(f"datastore {folder} is corrupt (format, shapes or checksum do not match){fix}")
        if vocab_hash is not None and meta.get("vocab_hash") != vocab_hash:
            raise SpecbenchError(f"datastore {folder} was built for another tokenizer (vocab {meta.get('vocab_hash')}, "
                                 f"the target's is {vocab_hash}){fix}")
        return cls(tokens, suffixes, meta)

    # ---- queries ------------------------------------------------------------------------------
    def _at(self, i: int, depth: int) -> int:
        """Token `depth` of the i-th smallest suffix; -2 past the end (a shorter suffix sorts first)."""
        p = int(self.suffixes[i]) + depth
        return int(self.tokens[p]) if p < self.size else -2

    def narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """[lo, hi) holds the suffixes that start with a pattern of `depth` tokens; the sub-interval
        of those whose next token is `token` (empty: lo == hi)."""
        a, b = lo, hi
        while a < b:                       # first suffix whose next token is >= token
            m = (a + b) // 2
            if self._at(m, depth) < token:
                a = m + 1
            else:
                b = m
        start, b = a, hi
        while a < b:                       # first suffix whose next token is > token
            m = (a + b) // 2
            if self._at(m, depth) <= token:
                a = m + 1
            else:
                b = m
        return start, a

    def find(self, pattern: Sequence[int]) -> tuple[int, int]:
        """The interval of suffixes starting with `pattern` (empty when it does not occur)."""
        lo, hi = 0, self.size
        for depth, t in enumerate(pattern):
            lo, hi = self.narrow(lo, hi, depth, int(t))
            if lo >= hi:
                break
        return lo, hi

    def longest_suffix(self, tokens: Sequence[int], max_len: int, min_len: int = 1) -> tuple[int, int, int]:
        """(length, lo, hi): the longest suffix of `tokens`, between `min_len` and `max_len` long,
        that occurs in the corpus, and its interval; (0, 0, 0) when none does. A suffix occurs
        only if its own suffixes do, so the length is found by binary search."""
        lo_len, hi_len, best = min_len, min(max_len, len(tokens)), (0, 0, 0)
        while lo_len <= hi_len:
            mid = (lo_len + hi_len) // 2
            lo, hi = self.find(tokens[len(tokens) - mid:])
            if lo < hi:
                best, lo_len = (mid, lo, hi), mid + 1
            else:
                hi_len = mid - 1
        return best

    def extend_match(self, match: tuple[int, int, int], context: Sequence[int]) -> tuple[int, int, int]:
        """SAM-Decoding's step of a suffix automaton, on the suffix array: `match` (length, lo, hi)
        is the longest suffix of context[:-1] that occurs in the corpus (EMPTY_MATCH: none yet), the
        result that of `context`. The match grows by one token where it can, else the longest
        shorter suffix is searched afresh (it is at most as long as the old match)."""
        length, lo, hi = match
        lo2, hi2 = self.narrow(lo, hi, length, int(context[-1]))
        if lo2 < hi2:
            return length + 1, lo2, hi2
        found = self.longest_suffix(context, max_len=length, min_len=1)
        return found if found[0] else self.empty_match()

    def empty_match(self) -> tuple[int, int, int]:
        """The match of the empty pattern: every suffix."""
        return 0, 0, self.size

    def first_start(self, lo: int, hi: int) -> int:
        """The smallest start position among the interval's suffixes (its first occurrence)."""
        return int(self.suffixes[lo:hi].min())

    def continuation(self, start: int, length: int) -> list[int]:
        """Up to `length` corpus tokens from `start`, stopping at a document's end."""
        out = []
        for t in self.tokens[start : start + length].tolist():
            if t == SEPARATOR:
                break
            out.append(t)
        return out

    def continuations(self, lo: int, hi: int, depth: int, length: int, limit: int) -> np.ndarray:
        """[m, length] int64: the `length` tokens after the pattern (`depth` tokens) of the first
        m = min(hi - lo, limit) suffixes of the interval, in suffix order; -1 past a document's end."""
        starts = self.suffixes[lo : min(hi, lo + limit)].astype(np.int64) + depth
        idx = starts[:, None] + np.arange(length)[None, :]
        out = self.tokens[np.minimum(idx, self.size - 1)].astype(np.int64)
        out[idx >= self.size] = SEPARATOR
        out[np.cumsum(out == SEPARATOR, axis=1) > 0] = SEPARATOR
        return out

    def next_tokens(self, lo: int, hi: int, depth: int, k: int) -> list[tuple[int, int]]:
        """The (token, count) of the k most frequent next tokens after the interval's pattern of
        `depth` tokens, most frequent first (ties: smaller id first); document ends excluded."""
        pos = self.suffixes[lo:hi].astype(np.int64) + depth
        nxt = self.tokens[pos[pos < self.size]]
        ids, counts = np.unique(nxt[nxt != SEPARATOR], return_counts=True)
        order = np.lexsort((ids, -counts))[:k]
        return [(int(ids[i]), int(counts[i])) for i in order]


# ---- where built indexes live -------------------------------------------------------------------
def datastore_dir(name: str, target_name: str) -> Path:
    """The cache folder of datastore `name` built for `target_name`."""
    from harness.core.target import cache_root  # the target module pulls in torch; the index needs numpy only

    safe = target_name.replace("/", "--")
    return cache_root() / "datastores" / name / safe


def load_datastore(spec: str, target) -> TokenIndex:
    """The datastore a method's config names: a built one's name ("default": the project's corpus,
    `cli.py datastore build`) for this target, or a folder; checked against the target's tokenizer."""
    if "/" in spec or spec.startswith("."):
        folder, hint = Path(spec).expanduser(), "build one with `python cli.py datastore build --out FOLDER`"
    else:
        folder = datastore_dir(spec, target.name)
        named = "" if spec == "default" else f" --name {spec} --from FILE"
        hint = f"build it with `python cli.py datastore build --target {target.name}{named}`"
    return TokenIndex.load(folder, target.vocab_hash(), hint)
