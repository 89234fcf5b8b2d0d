"""EAGLE / EAGLE-2: tree invariants, exactness after brief training, official checkpoint layout."""
from __future__ import annotations

import pytest
import torch

from harness.core.decode import DraftContext
from harness.core.verify import Sampling
from harness.testing.official_states import eagle_official_state
from methods.common.eagle_core import EagleCore
from methods.eagle import Eagle
from methods.eagle2 import Eagle2
from tests.train_helpers import assert_greedy_exact, tiny_dataset, train_quickly, vicuna7b_meta


@pytest.fixture(scope="module")
def trained_eagle(tiny_target, tmp_path_factory):
    d = Eagle(tiny_target)
    train_quickly(d, tiny_dataset(tiny_target), tmp_path_factory.mktemp("eagle"), steps=200)
    path = tmp_path_factory.mktemp("eagle-ck")
    d.save_pretrained(path)
    return path


def _begin(d, target, prompt):
    from harness.core.kvcache import KVCache

    cache = KVCache(target.num_layers)
    pre = target.forward(torch.tensor(prompt), cache)
    root = int(pre.logits[-1].argmax())
    d.begin(torch.tensor(prompt), pre, root)
    return DraftContext(prompt + [root], root, Sampling(), None, 100)


def test_eagle2_tree_invariants_at_official_settings(tiny_target):
    torch.manual_seed(0)  # the untrained head's weights; the checks below hold for any
    d = Eagle2(tiny_target, {"top_k": 10, "depth": 5, "total_tokens": 60})
    d.eval()
    ctx = _begin(d, tiny_target, [1, 2, 3, 4, 5])
    tree = d.propose(ctx)
    assert d.last_pool_size == 10 + 5 * 100
    assert tree.size == 59  # ties between a parent and its child are broken towards the parent
    m = tree.ancestor_mask
    assert torch.equal(m, m.tril()) and m[:, 0].all()
    assert torch.equal(m.sum(1) - 1, tree.depths)
    assert int(tree.depths.max()) <= 6
    for path in tree.paths():
        assert all(tree.parent_list[b] == a for a, b in zip(path, path[1:]))


def test_eagle2_auto_expands_one_level_past_the_last_tree(tiny_target, monkeypatch):
    """With total_tokens "auto" a step runs one expansion more than the last tree used: a tree of
    depth-1 nodes only is followed by one expansion, and a tree that keeps everything lets the
    expansions grow back a level per step (untrained weights; the budget is forced)."""
    torch.manual_seed(0)
    d = Eagle2(tiny_target, {"total_tokens": "auto", "draft_vocab": 0}).eval()
    k, depth = d.config["top_k"], d.config["depth"]
    ctx = _begin(d, tiny_target, [1, 2, 3, 4, 5])
    monkeypatch.setattr(d, "tree_budget", lambda scores: 1)
    tree = d.propose(ctx)
    assert d.last_pool_size == k + depth * k * k  # an answer's first step expands fully
    assert tree.size == 1 and int(tree.depths.max()) == 1
    d.propose(ctx)
    assert d.last_pool_size == k + k * k
    monkeypatch.setattr(d, "tree_budget", lambda scores: len(scores))
    pools = []
    for _ in range(depth + 1):
        d.propose(ctx)
        pools.append(d.last_pool_size)
    assert pools == [k + s * k * k for s in range(1, depth + 1)] + [k + depth * k * k]


def test_eagle1_static_tree_shape(tiny_target):
    d = Eagle(tiny_target)
    ctx = _begin(d, tiny_target, [7, 8, 9])
    tree = d.propose(ctx)
    assert tree.size == 25
    assert [int((tree.depths == k).sum()) for k in range(1, 6)] == [4, 8, 8, 3, 2]


@pytest.mark.parametrize("cls", [Eagle, Eagle2])
def test_greedy_equals_ar_after_brief_training(tiny_target, trained_eagle, cls):
    d = cls.from_pretrained(trained_eagle, tiny_target)
    assert_greedy_exact(tiny_target, d, seed=97)


@pytest.mark.slow
def test_greedy_equals_ar_with_the_drafter_compiled(trained_eagle):
    """--compile compiles the draft layers too: EAGLE-2 on a compiled target with its draft layer
    compiled still reproduces AR token for token (inductor's default mode, to keep it short)."""
    from tests.conftest import make_tiny_target

    target = make_tiny_target()
    target.enable_compile("default")
    d = Eagle2.from_pretrained(trained_eagle, target)
    d.enable_compile("default")
    assert_greedy_exact(target, d, seed=97)
    (runtime,) = d.runtimes()
    assert {1, 8} <= runtime.compiled_buckets  # observe's rows and the 8-beam expansions ran compiled


@pytest.mark.parametrize("bias,emb", [(True, True), (False, False)])
def test_official_layout_loads(tiny_target, tmp_path, bias, emb):
    st = eagle_official_state(bias=bias, emb=emb)
    torch.save(st, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 1}')
    d = Eagle.from_pretrained(tmp_path, tiny_target)
    assert torch.equal(d.fc.weight, st["fc.weight"])
    assert torch.equal(d.stack.layers[0].mlp.down_proj.weight, st["layers.0.mlp.down_proj.weight"])
    assert (d.fc.bias is not None) == bias
    del st["layers.0.mlp.up_proj.weight"]
    torch.save(st, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="do not fit"):
        Eagle.from_pretrained(tmp_path, tiny_target)


def test_official_draft_config_sizes_win_over_the_targets(tiny_target, tmp_path):
    # A released draft may declare other layer sizes than its target (EAGLE's Vicuna-33B config does).
    st = eagle_official_state(i=176, nkv=4)
    torch.save(st, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "intermediate_size": 176, "num_key_value_heads": 4}')
    d = Eagle.from_pretrained(tmp_path, tiny_target)
    assert d.config["layer_config"] == {"intermediate_size": 176, "num_key_value_heads": 4}
    assert torch.equal(d.stack.layers[0].mlp.up_proj.weight, st["layers.0.mlp.up_proj.weight"])
    d.eval()
    assert d.propose(_begin(d, tiny_target, [1, 2, 3])).size == 25


def test_vicuna7b_sizes_on_meta_device():
    d = vicuna7b_meta(Eagle, lambda d, t: EagleCore.__init__(d, t, {"draft_vocab": 0}))
    keys = set(d.state_dict())
    assert len(keys) + 1 == 11  # + the embedding copy the released files carry
    assert d.num_parameters() == 235_937_792


def test_rollout_steps_match_inference(tiny_target):
    """Step s of the unrolled training forward equals what inference computes: the true context up
    to the chain start on the draft cache, then the draft's own features fed forward."""
    from harness.core.kvcache import KVCache

    torch.manual_seed(0)
    d = Eagle(tiny_target, {"rollout_steps": 3})
    d.eval()
    T, H = 9, tiny_target.hidden_size
    feats = torch.randn(1, T, H)
    ids = torch.randint(0, tiny_target.vocab_size, (1, T))
    outs = d.rollout(feats, ids)
    assert [o.shape[1] for o in outs] == [T - 1, T - 2, T - 3]
    for j in (0, 3, 5):
        d._cache = KVCache(1)
        # true pairs 0..j: (f_i, t_{i+1})
        h = d.draft_forward(ids[0, 1 : j + 2], feats[0, : j + 1], torch.arange(j + 1))[-1]
        for step in (2, 3):
            pos = torch.tensor([j + step - 1])
            h = d.draft_forward(ids[0, j + step : j + step + 1], h[None], pos)[-1]
            assert torch.allclose(h, outs[step - 1][0, j], atol=1e-4), (j, step)


def test_rollout_loss_trains(tiny_target, tmp_path):
    d = Eagle(tiny_target, {"rollout_steps": 3})
    res = train_quickly(d, tiny_dataset(tiny_target, n=32, holdout=0.25), tmp_path, steps=20)  # a few held out
    assert "val_acc3" in res and res["val_loss"] == res["val_loss"]  # finite


def test_rerank_keeps_a_parent_that_ties_with_its_child():
    """A child of probability ~1 scores exactly its parent's cumulative log-prob: the budget must
    still be a valid tree (parent kept first), so the tree size never depends on such ties."""
    from harness.core.tree_build import rerank

    scores = torch.tensor([-1.0, -1.0, -1.0, -2.0, -0.5])
    parents = [-1, 0, 1, 0, -1]
    for keep in range(1, 6):
        chosen = rerank(scores, parents, keep)
        assert len(chosen) == keep and all(parents[c] < 0 or parents[c] in chosen for c in chosen)
    assert rerank(scores, parents, 2) == [0, 4] and rerank(scores, parents, 3) == [0, 1, 4]


def test_int8_draft_weights_stay_exact_and_leave_the_target_alone(tiny_target, trained_eagle, monkeypatch):
    """weights=int8: the drafter's own maps (fc, the draft layer's attention and MLP) run on int8
    copies; the target's are never quantized, so greedy output still equals AR's. (The tiny target's
    vocabulary is below the draft-vocab size, so its drafts use the target's full LM head as is.)"""
    from harness.core import packed_linear

    made = []
    real = packed_linear.quantize_int8
    monkeypatch.setattr(packed_linear, "quantize_int8", lambda w: made.append(tuple(w.shape)) or real(w))
    d = Eagle2.from_pretrained(trained_eagle, tiny_target, {"weights": "int8"})
    assert_greedy_exact(tiny_target, d, seed=97)
    h = tiny_target.hidden_size
    assert made.count((h, 2 * h)) == 2  # EAGLE's fc, and the MLP's down map
    assert len(made) == 5  # + the fused q/k/v, o, and the fused gate/up maps, each made once
    assert all(p.dtype != torch.int8 for p in tiny_target.model.parameters())
    with pytest.raises(Exception, match="weights='int4' is not one of native, int8"):
        Eagle2(tiny_target, {"weights": "int4"})
