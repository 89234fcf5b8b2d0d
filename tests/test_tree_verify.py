"""Tree tensors, tree-masked forwards against plain causal forwards, cache commit, greedy rule."""
from __future__ import annotations

import torch

from harness.core.tree import DraftTree, tree_from_parent_map
from harness.core.verify import Sampling, verify_greedy, verify_typical
from tests.train_helpers import assert_tree_logits_match_paths


def small_tree() -> DraftTree:
    #        0
    #      / | \
    #     1  2  3
    #    / \     \
    #   4   5     6
    #   |
    #   7
    return tree_from_parent_map(10, [11, 12, 13, 14, 15, 16, 17], [0, 0, 0, 1, 1, 3, 4])


def test_tree_invariants():
    t = small_tree()
    m = t.ancestor_mask
    assert torch.equal(m, m.tril()), "mask must be lower-triangular in topological order"
    assert m[:, 0].all(), "every node sees the root"
    assert torch.equal(m.sum(1) - 1, t.depths)
    assert t.depths.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    for path in t.paths():
        assert path[0] == 0
        for a, b in zip(path, path[1:]):
            assert t.parent_list[b] == a
    assert sorted(p[-1] for p in t.paths()) == [2, 5, 6, 7]
    ri = t.retrieve_indices()
    assert ri.shape == (4, 4) and (ri[:, 0] == 0).all()


def test_chain_and_bad_parents():
    t = DraftTree.chain(5, [6, 7, 8])
    assert t.parent_list == [-1, 0, 1, 2] and t.size == 3
    try:
        DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 1]))
    except ValueError:
        pass
    else:
        raise AssertionError("a node that is its own parent must be refused")


def test_tree_forward_equals_causal_path_forward(device_target):
    t = device_target
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, t.vocab_size, (9,), generator=g)
    tree = tree_from_parent_map(int(prefix[-1]), torch.randint(0, t.vocab_size, (7,), generator=g).tolist(),
                                [0, 0, 0, 1, 1, 3, 4])
    assert_tree_logits_match_paths(t, prefix[:-1], tree)


def test_commit_keeps_accepted_rows_in_order(device_target):
    t = device_target
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, t.vocab_size, (6,), generator=g)
    tree = tree_from_parent_map(int(prefix[-1]), [3, 4, 5, 6, 7, 8, 9], [0, 0, 0, 1, 1, 3, 4])
    cache = t.new_cache()
    t.forward(prefix[:-1], cache)
    L = cache.length
    t.forward(tree.tokens, cache, position_ids=L + tree.depths, tree_mask=tree.attention_mask)
    path = [0, 1, 4, 7]
    cache.commit(L, torch.tensor(path))
    assert cache.length == L + 4
    nxt = torch.tensor([11])
    got = t.forward(nxt, cache).logits[-1]
    ref_seq = torch.cat([prefix[:-1], tree.tokens[path], nxt])
    ref = t.forward(ref_seq, t.new_cache()).logits[-1]
    assert torch.allclose(got, ref, atol=1e-4)


def test_greedy_picks_longest_matching_path():
    tree = small_tree()
    V = 20
    logits = torch.zeros(8, V)
    # target argmax: root -> 11 (node 1), node1 -> 14 (node 4), node4 -> 17 (node 7), node7 -> 19 (bonus)
    for node, tok in [(0, 11), (1, 14), (4, 17), (7, 19), (2, 0), (3, 0), (5, 0), (6, 0)]:
        logits[node, tok] = 5.0
    v = verify_greedy(tree, logits)
    assert v.path == [0, 1, 4, 7] and v.bonus == 19 and v.accepted == 3
    logits[0] = 0
    logits[0, 13] = 5.0  # now the root wants 13 (node 3); node 3 wants 0, no child has it
    v = verify_greedy(tree, logits)
    assert v.path == [0, 3] and v.bonus == 0


def test_typical_acceptance_on_hand_made_distribution():
    # Root distribution peaked on token 1 (p = 0.9): accepted; on node 1 a flat distribution over
    # 4 tokens (p = 0.25 each, entropy log 4): threshold min(0.09, 0.3 * 0.25) = 0.075 -> token 2 accepted.
    tree = tree_from_parent_map(0, [1, 3, 2], [0, 0, 1])
    V = 4
    logits = torch.full((4, V), -1e4)
    logits[0] = torch.log(torch.tensor([0.02, 0.9, 0.04, 0.04]))
    logits[1] = torch.zeros(V)
    logits[2] = torch.zeros(V)
    logits[3] = torch.zeros(V)
    v = verify_typical(tree, logits, Sampling(1.0, 1.0, "typical"), torch.Generator().manual_seed(0))
    assert v.path == [0, 1, 3]
    # A draft with p below the threshold is rejected: token 0 at the root has p = 0.02 < 0.09·... threshold
    tree2 = tree_from_parent_map(0, [0], [0])
    v2 = verify_typical(tree2, logits[:2], Sampling(1.0, 1.0, "typical"), torch.Generator().manual_seed(0))
    assert v2.path == [0]
