"""Medusa: loss offsets, static-tree buffers, exactness with briefly trained heads."""
from __future__ import annotations

import torch

from harness.core.tree import StaticTree
from harness.core.tree_build import walk_static_tree
from harness.train.data import DistillBatch
from methods.medusa import Medusa
from tests.train_helpers import assert_greedy_exact, tiny_dataset, train_quickly


def test_static_tree_buffers_for_a_small_choices_list():
    tree = StaticTree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    assert tree.parents == [0, 0, 1, 1, 2, 3]
    assert tree.depths == [1, 1, 2, 2, 2, 3] and tree.topk == 2
    top = [[10, 11], [20, 21], [30, 31]]  # depth-d nodes take rank r of top[d - 1], as Medusa's heads
    seen = []

    def rank_children(level):
        seen.append((level.depth, level.nodes, level.need))
        return [top[level.depth]] * len(level.nodes)

    dt = walk_static_tree(5, tree, 10, rank_children)
    assert dt.tokens.tolist() == [5, 10, 11, 20, 21, 20, 30]
    assert dt.parent_list == [-1, 0, 0, 1, 1, 2, 3]
    m = dt.ancestor_mask
    assert torch.equal(m.sum(1) - 1, dt.depths) and m[:, 0].all() and torch.equal(m, m.tril())
    assert dt.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    # Only nodes with children are expanded, each told how many ranks its children use.
    assert seen == [(0, [0], [2]), (1, [1, 2], [2, 1]), (2, [3], [1])]
    # Room for only 2 new tokens: depth capped at 1.
    assert walk_static_tree(5, tree, 2, rank_children).size == 2
    # A ranking shorter than asked for (a sampled draft) drops the missing ranks and their subtrees.
    short = walk_static_tree(5, tree, 10, lambda level: [[7]] * len(level.nodes))
    assert short.tokens.tolist() == [5, 7, 7, 7] and short.parent_list == [-1, 0, 1, 2]


def test_official_tree_shape():
    t = StaticTree.named("mc_sim_7b_63")
    assert len(t.nodes) == 63 and t.max_depth == 4
    assert [t.depths.count(d) for d in (1, 2, 3, 4)] == [10, 28, 23, 2]


def test_loss_scores_head_k_against_token_k_plus_2_ahead(tiny_target):
    d = Medusa(tiny_target, {"heads": 2})
    T, H = 8, tiny_target.hidden_size
    feats = torch.randn(1, T, H)
    ids = torch.arange(T)[None] + 3
    batch = DistillBatch(ids, feats, feats, torch.ones(1, T), torch.ones(1, T))
    out = d.loss(batch)
    # Reference: head k at position t predicts ids[t + 2 + k].
    ref = 0.0
    for k in range(2):
        logits = tiny_target.project(d.head_hidden(k, feats[0, : T - 2 - k])).float()
        ref += torch.nn.functional.cross_entropy(logits, ids[0, 2 + k :])
    assert torch.allclose(out["loss"], ref, atol=1e-4)


def test_greedy_medusa_equals_ar_after_brief_training(tiny_target, tmp_path):
    data = tiny_dataset(tiny_target)
    d = Medusa(tiny_target, {"heads": 3, "tree": "cpu_15"})
    train_quickly(d, data, tmp_path / "medusa", steps=150)
    d.save_pretrained(tmp_path / "ck")
    d = Medusa.from_pretrained(tmp_path / "ck", tiny_target)
    assert_greedy_exact(tiny_target, d, seed=99)
