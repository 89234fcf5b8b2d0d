"""REST: the trie of retrieved continuations against a brute-force count, the lookup (longest
suffix of 2..16 tokens, the root included), greedy output equal to AR with drafts accepted
(tiny target; `-m smollm2`: real prompts on a datastore of the distilled answers), and a missing
datastore as one line. Lossless sampling: tests/test_training_free_law.py."""
from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

from harness.core.decode import DraftContext, GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.verify import Sampling
from methods.common.token_index import SEPARATOR, TokenIndex
from methods.rest import Rest, trie_nodes
from tests.real_prompts import greedy_tau
from tests.test_exactness import prompts


def node_paths(nodes) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for n in nodes:
        paths.append((paths[n.parent] if n.parent >= 0 else ()) + (n.token,))
    return paths


def test_trie_keeps_the_most_frequent_prefixes():
    rng = random.Random(0)
    for _ in range(200):
        m, width = rng.randint(1, 30), rng.randint(1, 6)
        rows = np.array([[rng.randrange(3) for _ in range(width)] for _ in range(m)], dtype=np.int64)
        for r in range(m):  # ends of documents: the rest of the row is SEPARATOR
            cut = rng.randint(1, width + 2)
            rows[r, cut:] = SEPARATOR
        keep, depth = rng.randint(1, 12), rng.randint(1, width)
        counts = Counter(tuple(row[:d]) for row in rows.tolist() for d in range(1, depth + 1)
                         if SEPARATOR not in row[:d])
        want = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:keep]
        nodes = trie_nodes(rows, keep, depth)
        got = node_paths(nodes)
        assert got == want
        assert all(n.parent < i for i, n in enumerate(nodes))           # parents first: a trie
        assert [n.score for n in nodes] == pytest.approx([math.log(counts[p] / m) for p in want])


def rest_with(target, docs, tmp_path, **config) -> Rest:
    TokenIndex.build(docs, {"vocab_hash": target.vocab_hash()}).save(tmp_path / "ds")
    return Rest(target, {"datastore": str(tmp_path / "ds"), **config})


def test_propose_merges_the_continuations_of_the_longest_match(tiny_target, tmp_path):
    """Context ... 7 8 9 (the root 9): the 3-token suffix occurs twice, followed by 1 2 and 1 3; the
    2-token suffix 8 9 also occurs before 5, but the longest match wins."""
    d = rest_with(tiny_target, [[7, 8, 9, 1, 2], [7, 8, 9, 1, 3], [8, 9, 5]], tmp_path, continuation=2)
    tree = d.propose(DraftContext([4, 7, 8, 9], 9, Sampling(), None, max_nodes=10))
    assert tree.tokens.tolist() == [9, 1, 2, 3] and tree.parents.tolist() == [-1, 0, 1, 1]
    assert d.propose(DraftContext([4, 9], 9, Sampling(), None, 10)).size == 0   # one token: below min_span
    assert d.propose(DraftContext([4, 7, 8, 9], 9, Sampling(), None, 2)).tokens.tolist() == [9, 1]


def test_greedy_rest_equals_ar_with_drafts_accepted(tiny_target, tmp_path):
    """The datastore holds the target's own greedy text for half the prompts, and noise."""
    cfg = GenerationConfig(max_new_tokens=48)
    ps = prompts(tiny_target.vocab_size, n=8)
    ars = [generate(tiny_target, p, cfg).output_ids for p in ps]
    rng = random.Random(0)
    noise = [[rng.randrange(tiny_target.vocab_size) for _ in range(40)] for _ in range(20)]
    d = rest_with(tiny_target, [p + a for p, a in zip(ps[::2], ars[::2])] + noise, tmp_path, num_draft=16)
    accepted = rejected = 0
    for i, p in enumerate(ps):
        sp = generate(tiny_target, p, cfg, d)
        assert sp.output_ids == ars[i], f"prompt {i}: rest diverged from AR"
        accepted += sum(sp.accepted)
        rejected += sum(a < s for a, s in zip(sp.accepted, sp.tree_size))
    assert accepted >= 40 and rejected > 0, (accepted, rejected)


def test_a_missing_datastore_is_one_line(tiny_target, tmp_path):
    with pytest.raises(SpecbenchError, match=r"^no datastore at .*datastore build --out FOLDER`$"):
        Rest(tiny_target, {"datastore": str(tmp_path / "none")})


@pytest.mark.slow
@pytest.mark.smollm2
def test_rest_on_smollm2_equals_ar_and_accepts(smollm2_fp32, shared_data, tmp_path):
    """A datastore of the committed distilled answers (ids) and two real prompts."""
    from harness.core.paths import REPO_ROOT
    from harness.train.datastore import build_datastore

    folder, _, _ = build_datastore(smollm2_fp32, [str(REPO_ROOT / "datasets" / "distill" / "smollm2-135m")],
                                   out=tmp_path / "ds")
    assert greedy_tau(smollm2_fp32, shared_data, Rest(smollm2_fp32, {"datastore": str(folder)})) > 1.2
