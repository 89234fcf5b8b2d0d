"""Gumiho: candidate pool, MLP inputs, FTA variants, loss offsets, exactness, official layout."""
from __future__ import annotations

import pytest
import torch

from harness.core.decode import GenerationConfig, generate
from harness.core.tree_build import Node, build_tree
from harness.runs.metrics import attach_divergences, own_divergences
from harness.runs.record import Record
from harness.train.data import DistillBatch
from harness.core.tree import DraftTree
from harness.core.verify import verify_greedy
from methods.gumiho import Gumiho, fta_exact, fta_paper
from tests.test_eagle import _begin
from tests.train_helpers import assert_greedy_exact, tiny_dataset, tiny_prompts, train_quickly, vicuna7b_meta


@pytest.fixture(scope="module")
def trained_gumiho(tiny_target, tmp_path_factory):
    d = Gumiho(tiny_target, {"mlp_heads": 3, "depth": 4, "mlp_ce_from_epoch": 0})
    train_quickly(d, tiny_dataset(tiny_target), tmp_path_factory.mktemp("gumiho"), steps=200)
    path = tmp_path_factory.mktemp("gumiho-ck")
    d.save_pretrained(path)
    return path


def test_pool_at_paper_settings(tiny_target):
    torch.manual_seed(0)  # the untrained weights; the checks below hold for any
    d = Gumiho(tiny_target, {"preset": "paper", "fta": "off"})
    assert (d.config["top_k"], d.config["depth"], d.config["mlp_heads"], d.config["mlp_topk"],
            d.config["pruning"], d.config["total_tokens"]) == (14, 6, 5, 35, 35, 64)
    d.eval()
    tree = d.propose(_begin(d, tiny_target, [3, 1, 4, 1, 5]))
    assert d.last_pool_size == 14 + 14 + 5 * 35 == 203
    assert tree.size == 63  # exactly the budget: the rerank keeps every kept node's parent
    assert int(tree.depths.max()) <= 7
    m = tree.attention_mask
    assert torch.equal(m, tree.ancestor_mask)


def test_auto_runs_mlp_heads_one_level_past_the_last_tree(tiny_target, monkeypatch):
    """With total_tokens "auto" a step runs the MLP heads of at most one level deeper than the last
    tree kept: after a tree of depth-1 nodes only, none (the serial level 2 is the next level); a
    tree that keeps everything lets the heads come back a level per step (untrained weights; the
    budget is forced)."""
    torch.manual_seed(0)
    d = Gumiho(tiny_target, {"total_tokens": "auto", "draft_vocab": 0, "fta": "off"}).eval()
    k, heads, prune = d.config["top_k"], d.config["mlp_heads"], d.config["pruning"]
    ctx = _begin(d, tiny_target, [1, 2, 3, 4, 5])
    calls = []
    monkeypatch.setattr(d, "run_mlp", lambda x, n=None, f=d.run_mlp: calls.append(n) or f(x, n))
    monkeypatch.setattr(d, "tree_budget", lambda scores: 1)
    tree = d.propose(ctx)
    assert d.last_pool_size == 2 * k + heads * prune and calls == [heads]  # an answer's first step: all heads
    assert tree.size == 1 and int(tree.depths.max()) == 1
    d.propose(ctx)
    assert d.last_pool_size == 2 * k and calls == [heads]  # no MLP call at all
    monkeypatch.setattr(d, "tree_budget", lambda scores: len(scores))
    pools = []
    for _ in range(heads + 1):
        d.propose(ctx)
        pools.append(d.last_pool_size)
    assert pools == [2 * k + h * prune for h in range(heads + 1)]  # the kept tree was only 1 deep
    assert calls == [heads] + list(range(1, heads + 1))


def test_mlp_heads_see_only_the_depth2_row(tiny_target, monkeypatch):
    d = Gumiho(tiny_target, {"fta": "off"})
    d.eval()
    seen = []
    real = d.run_mlp
    monkeypatch.setattr(d, "run_mlp", lambda x, heads=None: seen.append(x.shape) or real(x, heads))
    d.propose(_begin(d, tiny_target, [2, 7, 1, 8]))
    assert seen == [torch.Size([d.config["top_k"], 2 * tiny_target.hidden_size])]


def test_fta_exact_never_attends_outside_ancestors():
    # root -> a(d1) -> b(d2) -> c(d3) -> e(d4); root -> x(d1) (short path)
    nodes = [Node(1, -1, -0.1, 1), Node(2, -1, -2.0, 1), Node(3, 0, -0.3, 2), Node(4, 2, -0.5, 3), Node(5, 3, -0.7, 4)]
    out = fta_exact(nodes, budget=20)
    tree = build_tree(0, out)
    assert torch.equal(tree.attention_mask, tree.ancestor_mask) and not tree.extra_mask
    assert sum(n.borrowed for n in out) == 3
    # the short path root->x now continues with real copies of the trunk tokens 3, 4, 5
    x = next(i for i, n in enumerate(out) if n.token == 2 and n.depth == 1) + 1
    chain = []
    node = x
    while tree.children[node]:
        node = tree.children[node][0]
        chain.append(int(tree.tokens[node]))
    assert chain == [3, 4, 5]
    # A tight budget drops the lowest-scored leaf instead of exceeding it, then refills the slots that
    # frees: budget 5 keeps x without padding, budget 7 gives it a chain of 2 (trunk tokens 3, 4).
    for budget, borrowed in ((5, 0), (7, 2)):
        out = fta_exact(nodes, budget=budget)
        tree = build_tree(0, out)
        assert len(out) == budget and sum(n.borrowed for n in out) == borrowed
        assert sorted(n.token for n in out if not n.borrowed) == [1, 2, 3, 4, 5]
        assert torch.equal(tree.attention_mask, tree.ancestor_mask)


def test_fta_exact_refills_freed_slots_with_the_next_best_candidates():
    """Candidates beyond those the padding left fill what it freed: the best next one gets the chain
    that fits, and one under a padded leaf takes that leaf's chain over at no slot's cost."""
    # a(d1) -> b(d2) -> c(d3); x(d1) -> x1(d2), scored below the a-b-c trunk.
    nodes = [Node(1, -1, -0.1, 1), Node(2, 0, -0.2, 2), Node(3, 1, -0.3, 3), Node(7, -1, -1.0, 1),
             Node(8, 3, -1.1, 2)]
    # All five pad x1 by one: over by one. x1 goes, then x (padded by two): 2 slots free. x comes back
    # with one copy of the trunk's depth-2 token, and x1 takes that copy's slot over.
    out = fta_exact(nodes, budget=5)
    assert [(n.token, n.depth, n.borrowed) for n in out] == [(1, 1, False), (7, 1, False), (2, 2, False),
                                                             (8, 2, False), (3, 3, False)]
    assert build_tree(0, out).parent_list == [-1, 0, 0, 1, 2, 3]
    # Budget 4: the drops free 1 slot; x comes back unpadded, x1 would need a slot: the tree is a b c x.
    assert [(n.token, n.borrowed) for n in fta_exact(nodes, budget=4)] == [(1, False), (7, False), (2, False),
                                                                           (3, False)]


@pytest.mark.slow
def test_exact_fta_verifies_the_whole_budget(tiny_target, trained_gumiho):
    """With fta=exact every step verifies exactly the tree budget while the pool holds that many
    candidates within the answer's room (the FTA padding no longer gives slots up)."""
    d = Gumiho.from_pretrained(trained_gumiho, tiny_target, {"fta": "exact", "total_tokens": 32})
    max_levels = 2 + d.config["mlp_heads"]
    checked = 0
    for p in tiny_prompts(tiny_target.vocab_size, 4, seed=91):
        gen = generate(tiny_target, p, GenerationConfig(60), d)
        done = 1
        for size, new in zip(gen.tree_size, gen.tokens):
            if 60 - done > max_levels:  # room for every level: no candidate is cut by depth
                assert size == 31
                checked += 1
            done += new
    assert checked >= 20


def test_loss_offsets_on_hand_made_tensors(tiny_target):
    d = Gumiho(tiny_target, {"mlp_heads": 2, "depth": 3, "mlp_ce_from_epoch": 0})
    T, H = 9, tiny_target.hidden_size
    torch.manual_seed(0)
    for p in d.mlp.parameters():
        torch.nn.init.normal_(p, std=0.05)
    feats = torch.randn(1, T, H)
    ids = torch.arange(T)[None] + 4
    out = d.loss(DistillBatch(ids, feats, feats, torch.ones(1, T), torch.ones(1, T)))
    # Reference, written out position by position: h_j from (f_j, t_{j+1}); g_j = fc(emb t_{j+2}, h_j);
    # head k on [g_j ; g_{j+1}] regresses f_{j+3+k}.
    h = d.stack(d.fuse(ids[:, 1:], feats[:, :-1]), torch.arange(T - 1)[None])[0]
    ref_v = 0.0
    for k in range(2):
        per = []
        for j in range(T - 3 - k):
            g_j = d.fuse(ids[0, j + 2 : j + 3], h[j : j + 1])
            g_j1 = d.fuse(ids[0, j + 3 : j + 4], h[j + 1 : j + 2])
            pred = d.mlp[k](torch.cat([g_j, g_j1], -1))[0]
            per.append(torch.nn.functional.smooth_l1_loss(pred, feats[0, j + 3 + k]).item())
        ref_v += 0.8 ** (k + 1) * sum(per) / len(per) / 9.0
    serial_v = torch.nn.functional.smooth_l1_loss(h, feats[0, 1:], reduction="none").mean(-1).mean()
    assert abs(float(out["vloss"]) - float(serial_v.detach())) < 1e-4
    mlp_part = out["loss"].detach().item() - float(out["vloss"]) - 0.1 * float(out["ploss"])
    mlp_ce = mlp_part - ref_v
    assert mlp_ce > 0  # CE weight is on (epoch 0 >= mlp_ce_from_epoch 0)
    d.config["mlp_ce_from_epoch"] = 99  # before the switch: only the feature losses count
    out2 = d.loss(DistillBatch(ids, feats, feats, torch.ones(1, T), torch.ones(1, T)))
    assert abs(out2["loss"].detach().item() - float(out2["vloss"]) - 0.1 * float(out2["ploss"]) - ref_v) < 1e-4


@pytest.mark.parametrize("fta", ["off", "exact"])
def test_greedy_equals_ar(tiny_target, trained_gumiho, fta):
    d = Gumiho.from_pretrained(trained_gumiho, tiny_target, {"fta": fta})
    assert_greedy_exact(tiny_target, d, seed=96)


def test_paper_fta_only_adds_borrowed_continuations(tiny_target, trained_gumiho):
    """The official padding keeps the nodes and the attention of the tree without FTA: each short
    path's leaf is only verified with a node of a later column as its continuation. (The official
    code's edit of the leaf's attention to those nodes is shadowed by its causal verify mask:
    gumiho/model/modeling_llama_kv.py:888-921, so the leaf sees its ancestors only, as here.)"""
    trees = {}
    for fta in ("off", "paper"):
        d = Gumiho.from_pretrained(trained_gumiho, tiny_target, {"fta": fta, "total_tokens": 32})
        trees[fta] = d.propose(_begin(d, tiny_target, [3, 1, 4, 1, 5, 9]))
    off, paper = trees["off"], trees["paper"]
    assert torch.equal(off.tokens, paper.tokens) and torch.equal(off.parents, paper.parents)
    assert torch.equal(paper.attention_mask, paper.ancestor_mask)
    assert paper.extra_children and not off.extra_children
    leaves = {i for i, kids in enumerate(paper.children) if not kids}
    for leaf, borrowed in paper.extra_children.items():
        assert leaf in leaves and all(b > leaf and not paper.ancestor_mask[leaf, b] for b in borrowed)


def test_paper_fta_continues_a_short_path_only_along_its_padded_row():
    """The official padded row of a short leaf is [root, ..., leaf, m_c, m_c+1, ...] (the most frequent
    node of each deeper column): after a borrowed m_c only m_c+1 is tried, never another child of
    m_c. Tree: root -> 1 (a short leaf) and root -> 2 -> 3 -> {4, 5}; columns 1..3 are 2, 3, 4 (4
    and 5 tie: the lower node). Greedy argmax: root -> token of 1, 1 -> token of 3 (borrowed),
    3 -> token of 5: the row has 4 there, so the walk stops at 3 with 5's token as the bonus."""
    tokens = [10, 11, 12, 13, 14, 15]
    tree = fta_paper(DraftTree(torch.tensor(tokens), torch.tensor([-1, 0, 0, 2, 3, 3])))
    assert tree.extra_children == {1: [3]} and tree.borrowed_next == {2: 3, 3: 4}
    logits = torch.zeros(6, 20)
    for node, token in {0: 11, 1: 13, 3: 15}.items():
        logits[node, token] = 1.0
    verdict = verify_greedy(tree, logits)
    assert verdict.path == [0, 1, 3] and verdict.bonus == 15


def test_paper_fta_mismatches_are_counted(tiny_target, trained_gumiho):
    """Paper FTA is not lossless, so it may leave AR's greedy output: the harness's count of answers
    that diverge from AR equals the answers that differ, counted here directly; the lossless
    variants (exact, off) count none."""
    paper = {"fta": "paper", "mlp_row_alignment": "paper", "serial_sibling_mask": "paper", "total_tokens": 32}
    variants = {"paper": paper, "exact": {"fta": "exact", "total_tokens": 32}, "off": {"fta": "off", "total_tokens": 32}}
    drafters = {name: Gumiho.from_pretrained(trained_gumiho, tiny_target, cfg) for name, cfg in variants.items()}
    records, differ = [], {name: 0 for name in variants}
    for q, p in enumerate(tiny_prompts(tiny_target.vocab_size, 8, seed=95)):
        key = {"benchmark": "tiny", "question_id": q, "turn": 0, "temperature": 0.0, "seed": 0}
        ar = generate(tiny_target, p, GenerationConfig(40)).output_ids
        records.append(Record(**key, method="ar", acceptance="none", output_ids=ar))
        for name, d in drafters.items():
            out = generate(tiny_target, p, GenerationConfig(40), d).output_ids
            differ[name] += out != ar
            records.append(Record(**key, method=f"gumiho-{name}", acceptance="greedy", output_ids=out))
    attach_divergences(records)
    for name in variants:
        counted = own_divergences([r for r in records if r.method == f"gumiho-{name}"])
        assert len(counted) == differ[name], name
    assert differ["exact"] == differ["off"] == 0


def test_official_layout_and_vicuna7b_sizes(tiny_target, tmp_path):
    d = Gumiho(tiny_target)
    state = {k: v.clone() for k, v in d.state_dict().items()}
    official = {}
    for k, v in state.items():
        official[k.replace("stack.", "", 1)] = torch.randn_like(v)
    official["embed_tokens.weight"] = torch.randn(tiny_target.vocab_size, tiny_target.hidden_size)
    torch.save(official, tmp_path / "pytorch_model.bin")
    loaded = Gumiho.from_pretrained(tmp_path, tiny_target)
    assert torch.equal(loaded.mlp[3][2].linear.weight, official["mlp.3.2.linear.weight"])
    assert torch.equal(loaded.stack.layers[1].input_layernorm.weight, official["layers.1.input_layernorm.weight"])

    g = vicuna7b_meta(Gumiho)
    assert g.num_parameters() == 1_025_646_592
    # 79 keys of our own + the embedding copy = 80. (checkpoints.md's "82" counts 9 keys per
    # decoder layer, but a Llama layer without input norm has 8, as its own EAGLE table shows.)
    assert len(g.state_dict()) + 1 == 80
