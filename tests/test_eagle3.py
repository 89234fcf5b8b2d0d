"""EAGLE-3: the target's layer inputs reach the drafter, the training-time test equals inference and
trains, the draft vocabulary's d2t/t2d, the official checkpoint layout, exactness and lossless sampling."""
from __future__ import annotations

import json

import pytest
import torch

from harness.core.decode import DraftContext, GenerationConfig, generate, prefill
from harness.core.kvcache import KVCache
from harness.core.verify import Sampling
from harness.testing.official_states import eagle3_official_state
from harness.testing.oracle import OracleDrafter
from harness.train.data import DistillBatch, FeatureDataset
from harness.train.features import shard_tensors
from methods.eagle3 import Eagle3, eagle3_layers
from tests.conftest import make_tiny_target
from tests.train_helpers import assert_greedy_exact, tiny_prompts, train_quickly

LAYERS = 7  # the fewest target layers with three distinct captures: inputs of layers 2, 3, 4


@pytest.fixture(scope="module")
def target7():
    return make_tiny_target(layers=LAYERS)


def eagle3_dataset(target, layers: list[int], n: int = 32, new_tokens: int = 40) -> FeatureDataset:
    """The tiny target's own greedy continuations, with the inputs of `layers` (as `cli.py train` extracts)."""
    convs = []
    for p in tiny_prompts(target.vocab_size, n, seed=5):
        convs.append((p + generate(target, p, GenerationConfig(new_tokens)).output_ids, len(p)))
    return FeatureDataset([shard_tensors(target, convs, batch_size=32, layers=layers)], holdout=0.05, layers=layers)


def _begin(d, target, prompt: list[int]) -> DraftContext:
    """The loop's prefill (which hands the drafter its layers' inputs) and the first step's context."""
    _, _, root = prefill(target, prompt, GenerationConfig(100), None, d)
    return DraftContext(prompt + [root], root, Sampling(), None, 100)


@pytest.fixture(scope="module")
def trained_eagle3(target7, tmp_path_factory):
    d = Eagle3(target7, {"ttt_steps": 2})
    train_quickly(d, eagle3_dataset(target7, d.target_layers()), tmp_path_factory.mktemp("eagle3"), steps=80, lr=1e-2)
    path = tmp_path_factory.mktemp("eagle3-ck")
    d.save_pretrained(path)
    return path


# ---- the target's layer inputs ----------------------------------------------------------------
class LayerSpy(OracleDrafter):
    """The oracle's trees (so paths are accepted), recording the layer inputs the loop hands over."""

    name = "layer-spy"
    feature_layers = staticmethod(eagle3_layers)

    def begin(self, prompt, prefill, root):
        self.seen = [(len(prompt), prefill.layers)]

    def observe(self, step):
        self.seen.append((step.accepted + 1, step.layers))


def layer_inputs(target, ids: list[int]) -> dict[int, torch.Tensor]:
    """{i: [n, H]} the input of each decoder layer over `ids`, caught by hooks on transformers' layers."""
    got: dict[int, torch.Tensor] = {}
    hooks = [layer.register_forward_pre_hook(
        lambda m, args, kwargs, i=i: got.__setitem__(i, (args[0] if args else kwargs["hidden_states"])[0].clone()),
        with_kwargs=True) for i, layer in enumerate(target.backbone.layers)]
    try:
        target.backbone(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return got


def test_layer_choice_follows_the_official_code():
    assert eagle3_layers(32) == (2, 16, 29) and eagle3_layers(30) == (2, 15, 27) and eagle3_layers(7) == (2, 3, 4)


def test_loop_hands_the_drafter_the_inputs_of_its_layers(target7):
    """At prefill and after every verify (tree forwards on the eager runtime), the rows handed over
    are the inputs of target layers 2, L//2 and L-3 at the committed positions: those of a plain
    forward over the final sequence (hooks on transformers' layers), within float32 rounding."""
    prompt = [5, 17, 3, 44, 9, 12]
    truth = generate(target7, prompt, GenerationConfig(30)).output_ids
    spy = LayerSpy(target7, {"continuation": truth, "prompt_len": len(prompt), "depth": 4})
    out = generate(target7, prompt, GenerationConfig(30), spy).output_ids
    assert out == truth and target7.runtime is not None
    ref = layer_inputs(target7, prompt + truth)
    start, accepted = 0, 0
    for rows, layers in spy.seen:
        assert sorted(layers) == [2, 3, 4]
        for i in (2, 3, 4):
            assert layers[i].shape == (rows, target7.hidden_size)
            assert (layers[i] - ref[i][start : start + rows]).abs().max() < 1e-5, (start, i)
        start += rows
        accepted += rows > 1
    assert accepted >= 3  # paths of several nodes were handed over, not only roots


def test_runtime_capture_equals_transformers_path(target7):
    """The eager runtime's captured rows on a tree verify equal transformers' hidden_states."""
    prefix, tree_tokens = torch.tensor([3, 8, 1, 9]), torch.tensor([4, 7, 2])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs = []
    for kind in ("eager", "transformers"):
        target7.set_runtime(kind)
        cache = target7.new_cache()
        target7.forward(prefix, cache)
        outs.append(target7.forward(tree_tokens, cache, position_ids=torch.tensor([4, 5, 5]), tree_mask=mask,
                                    layers=[2, 3, 4]).layers)
    target7.set_runtime("eager")
    for i in (2, 3, 4):
        assert (outs[0][i] - outs[1][i]).abs().max() < 1e-5


# ---- the training-time test -----------------------------------------------------------------
def test_ttt_steps_match_inference(target7):
    """Step s of the unrolled training forward at position j equals what inference computes: the
    true pairs 0..j on the draft cache, then the layer's own outputs fed forward along the chain."""
    torch.manual_seed(0)
    d = Eagle3(target7, {"ttt_steps": 3})
    for p in d.parameters():  # norms away from 1, so a swapped input would show
        torch.nn.init.normal_(p, std=0.3 if p.dim() == 1 else 0.1)
        if p.dim() == 1:
            p.data += 1
    T, H = 9, target7.hidden_size
    ids = torch.randint(0, target7.vocab_size, (1, T))
    feats = torch.randn(1, T, 3 * H)
    batch = DistillBatch(ids, torch.zeros(1, T, H), torch.zeros(1, T, H), torch.ones(1, T), torch.ones(1, T), feats)
    with torch.no_grad():
        outs = d.unroll(batch)
        x = d.fc(feats[0])
        for j in (0, 3, 5):
            d._cache = KVCache(1)
            h = d.draft_forward(ids[0, 1 : j + 2], x[: j + 1], torch.arange(j + 1))[-1]
            assert torch.allclose(h, outs[0][0, j], atol=1e-5)
            for s in (1, 2):
                h = d.draft_forward(ids[0, j + 1 + s : j + 2 + s], h[None], torch.tensor([j + s]))[-1]
                assert torch.allclose(h, outs[s][0, j], atol=1e-5), (j, s)


def test_ttt_loss_decreases_on_a_tiny_batch(target7):
    torch.manual_seed(0)
    d = Eagle3(target7, {"ttt_steps": 3})
    data = eagle3_dataset(target7, d.target_layers(), n=6, new_tokens=16)
    from harness.train.data import collate

    batch = collate(data.train[:4], 64)
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(12):
        out = d.loss(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(float(out["loss"].detach()))
    assert {"ploss", "ploss2", "ploss3", "acc3"} <= set(out)
    assert losses[-1] < 0.8 * losses[0], losses


def test_ttt_loss_projects_only_loss_rows_and_equals_the_dense_sum(target7):
    """The loss gathers the positions that carry loss before either head projects them; it equals
    the dense sum over every position with prompt, padding and out-of-vocab rows weighted 0."""
    from harness.train.data import collate
    from methods.eagle3 import shifted

    torch.manual_seed(1)
    d = Eagle3(target7, {"ttt_steps": 3, "draft_vocab": 48})
    data = eagle3_dataset(target7, d.target_layers(), n=6, new_tokens=16)
    d.set_draft_vocab(torch.arange(48))
    batch = collate(data.train[:4], 64)
    assert 0 < float((batch.loss_mask * batch.attention_mask).mean()) < 1  # prompts and padding present
    got = d.loss(batch)
    with torch.no_grad():
        probs, keep = d.teacher(batch.target_features)
        weight = batch.loss_mask * batch.attention_mask * keep
        total = 0.0
        for s, x in enumerate(d.unroll(batch)):
            p, w = shifted(probs, 1 + s), shifted(weight, 1 + s)
            ce = (-(p * d.lm_head(d.norm(x)).float().log_softmax(-1)).sum(-1) * w).sum() / w.sum()
            assert abs(float(got["ploss" + ("" if s == 0 else str(s + 1))]) - float(ce)) < 1e-5
            total += 0.8 ** s * float(ce)
    assert abs(float(got["loss"].detach()) - total) < 1e-5


def test_teacher_masks_top1_outside_the_draft_vocab(target7):
    d = Eagle3(target7, {"draft_vocab": 32})
    d.set_draft_vocab(torch.arange(0, 64, 2))
    f = torch.randn(2, 5, target7.hidden_size)
    probs, keep = d.teacher(f)
    z = target7.project(f).float()
    assert torch.allclose(probs, z[..., 0:64:2].softmax(-1), atol=1e-6)
    top = z.argmax(-1)
    assert torch.equal(keep.bool(), (top % 2 == 0) & (top < 64))


# ---- draft vocabulary ----------------------------------------------------------------------
def test_d2t_t2d_round_trip(target7):
    d = Eagle3(target7, {"draft_vocab": 32}).eval()
    V = target7.vocab_size
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:32]
    d.set_draft_vocab(ids)
    want = ids.sort().values
    assert torch.equal(d.draft_ids(), want)
    assert torch.equal(d.d2t, want - torch.arange(32)) and d.d2t.dtype == torch.long
    assert d.t2d.dtype == torch.bool and torch.equal(d.t2d.nonzero().flatten(), want)
    # Draft index j, made the best logit, comes out as target id draft_ids[j].
    with torch.no_grad():
        d.lm_head.weight.zero_()
        d.norm.weight.fill_(1.0)
        h = torch.ones(3, target7.hidden_size)
        for row, j in enumerate((0, 7, 31)):
            d.lm_head.weight[j] = 1.0 + row
            _, top = d.draft_topk(h[row : row + 1], 1)
            assert int(top) == int(want[j])
    with pytest.raises(Exception, match="needs 32 ids"):
        d.set_draft_vocab(ids[:5])
    assert Eagle3(target7, {"draft_vocab": 0}).d2t is None  # full vocab: no buffers, as the official loader


# ---- official checkpoint layout --------------------------------------------------------------
def write_official(folder, st, vd=32):
    torch.save(st, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
                                                    "intermediate_size": 128, "num_attention_heads": 4,
                                                    "num_key_value_heads": 2, "draft_vocab_size": vd}))


def test_official_layout_loads(target7, tmp_path):
    st = eagle3_official_state()
    assert len(st) == 15
    write_official(tmp_path, st)
    d = Eagle3.from_pretrained(tmp_path, target7, {"total_tokens": 16})
    assert d.config["draft_vocab"] == 32
    mine = d.state_dict()
    assert set(mine) == set(st)  # our own checkpoints use the official names too
    for k, t in st.items():
        assert mine[k].dtype == (torch.float32 if t.is_floating_point() else t.dtype), k
        assert torch.equal(mine[k], t.float() if t.is_floating_point() else t), k
    assert torch.equal(d.draft_ids(), st["t2d"].nonzero().flatten())
    d.eval()
    tree = d.propose(_begin(d, target7, [1, 2, 3]))  # drafts are target ids of the draft vocab
    assert tree.size > 0 and all(bool(st["t2d"][t]) for t in tree.tokens[1:].tolist())
    # SGLang/SpecForge files name the layer `layers.0.`: the same weights.
    alias = {k.replace("midlayer.", "layers.0.", 1): t for k, t in st.items()}
    write_official(tmp_path, alias)
    assert torch.equal(Eagle3.from_pretrained(tmp_path, target7).midlayer.self_attn.q_proj.weight,
                       st["midlayer.self_attn.q_proj.weight"].float())
    del st["midlayer.hidden_norm.weight"]
    write_official(tmp_path, st)
    with pytest.raises(Exception, match="do not fit"):
        Eagle3.from_pretrained(tmp_path, target7)


def test_official_layout_at_full_vocab_ignores_d2t(target7, tmp_path):
    """With draft_vocab_size == the target's vocab the official loader deletes d2t/t2d; so do we."""
    st = eagle3_official_state(vd=96)
    write_official(tmp_path, st, vd=96)
    d = Eagle3.from_pretrained(tmp_path, target7)
    assert d.config["draft_vocab"] == 0 and d.d2t is None and "d2t" not in d.state_dict()
    write_official(tmp_path, st, vd=50)
    with pytest.raises(Exception, match="draft_vocab_size 50"):
        Eagle3.from_pretrained(tmp_path, target7)


def test_llama31_8b_sizes_on_meta_device():
    """At Llama-3.1-8B sizes (draft vocab 32,000): 424,689,664 trainable elements, as checkpoints.md counts."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=32)
    with torch.device("meta"):
        fake = SimpleNamespace(config=cfg, hidden_size=4096, vocab_size=128256, num_layers=32, name="llama-3.1-8b",
                               device=torch.device("meta"), dtype=torch.float16,
                               lm_head=torch.nn.Linear(4096, 128256, bias=False))
        d = Eagle3(fake, {"draft_vocab": 32000})
    assert d.num_parameters() == 424_689_664
    assert len(d.state_dict()) == 15 and d.target_layers() == [2, 16, 29]


# ---- configuration ---------------------------------------------------------------------------
def test_paper_preset_and_keys(target7):
    torch.manual_seed(0)
    d = Eagle3(target7, {"preset": "paper"}).eval()
    assert (d.config["top_k"], d.config["depth"], d.config["total_tokens"]) == (10, 7, 60)
    tree = d.propose(_begin(d, target7, [1, 2, 3, 4, 5]))
    assert d.last_pool_size == 10 + 7 * 100 and tree.size == 59 and int(tree.depths.max()) <= 8
    assert Eagle3(target7, {"preset": "paper", "top_k": 4}).config["top_k"] == 4  # an explicit key wins
    assert Eagle3.resolve_config({})["ttt_steps"] == 7
    assert Eagle3.checkpoint_name(Eagle3.resolve_config({"ttt_steps": 3})) != "eagle3"  # a training key
    assert Eagle3.checkpoint_name(Eagle3.resolve_config({"preset": "paper"})) == "eagle3"  # inference keys
    with pytest.raises(Exception, match="at least 7"):
        Eagle3(make_tiny_target(layers=6))
    with pytest.raises(Exception, match="preset"):
        Eagle3(target7, {"preset": "gpu"})


def test_metadata_in_the_registry():
    from methods.registry import get_method, method_info

    info = method_info("eagle3")
    assert get_method("eagle3") is Eagle3
    assert (info.display_name, info.year, info.color, info.order) == ("EAGLE-3", 2025, "#882255", 65)
    assert info.paper == "Li et al., 2025 (arXiv 2503.01840)" and "midlayer" in info.checkpoint_layout


# ---- exactness and sampling ------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [{"total_tokens": 16}, {"preset": "paper"}], ids=["16-tokens", "paper-60"])
def test_greedy_equals_ar_random_init(target7, cfg):
    torch.manual_seed(1)
    d = Eagle3(target7, cfg).eval()
    for p in tiny_prompts(target7.vocab_size, 4, seed=31):
        ar = generate(target7, p, GenerationConfig(32)).output_ids
        assert generate(target7, p, GenerationConfig(32), d).output_ids == ar


def test_fusing_one_layer_reads_trains_and_decodes_exactly(target7, tmp_path):
    """fuse_layers=high (the fusion ablation): the drafter asks for layer L-3's input alone, fc is
    H -> H, it trains on one layer's features, and its drafts keep the output AR's token for token;
    the key survives a checkpoint round trip, and a bad name is refused."""
    torch.manual_seed(2)
    d = Eagle3(target7, {"fuse_layers": "high", "ttt_steps": 2, "total_tokens": 16})
    assert d.target_layers() == [4] and d.fc.in_features == target7.hidden_size
    assert Eagle3(target7, {"fuse_layers": "high,low"}).target_layers() == [2, 4]
    train_quickly(d, eagle3_dataset(target7, d.target_layers()), tmp_path / "train", steps=80, lr=1e-2)
    d.save_pretrained(tmp_path / "ck")
    back = Eagle3.from_pretrained(tmp_path / "ck", target7, {"total_tokens": 16})
    assert back.config["fuse_layers"] == "high" and back.fc.in_features == target7.hidden_size
    assert_greedy_exact(target7, back, seed=41)
    from harness.core.errors import SpecbenchError
    with pytest.raises(SpecbenchError, match="fuse_layers"):
        Eagle3(target7, {"fuse_layers": "top"})


def test_greedy_equals_ar_after_brief_training(target7, trained_eagle3):
    """Trained a little, the drafts are accepted on >= 30% of steps, so the accepted-path commit of
    the draft cache is exercised; the output is still AR's token for token."""
    d = Eagle3.from_pretrained(trained_eagle3, target7, {"total_tokens": 16})
    assert_greedy_exact(target7, d, seed=97)


def test_sampling_matches_exact_ar_law(temperature: float = 1.0, top_p: float = 1.0):
    """tests/test_sampling.py's law check with an EAGLE-3 drafter (random weights, dynamic tree,
    point-mass drafts) on a 7-layer target with the 6-token vocabulary, at the main grid's T = 1
    (the temperature/top-p branches of the shared verifier are checked there, with EAGLE-2)."""
    from tests import test_sampling as law

    torch.set_num_threads(1)
    target = make_tiny_target(vocab=law.VOCAB, hidden=32, layers=LAYERS, seed=0)

    def last(ids):
        return target.forward(torch.tensor(ids), target.new_cache()).logits[-1].float()

    v = law.VOCAB
    ar_logits = (last(law.PROMPT), torch.stack([last(law.PROMPT + [a]) for a in range(v)]),
                 torch.stack([torch.stack([last(law.PROMPT + [a, b]) for b in range(v)]) for a in range(v)]))
    torch.manual_seed(7)
    drafter = Eagle3(target, {"top_k": 3, "depth": 2, "total_tokens": 8})
    joint, _ = law.ar_law(ar_logits, temperature, top_p)
    counts, accepted = law.sample_counts(target, drafter, temperature, top_p)
    stat, df, p = law.pooled_chi2(counts, joint)
    print(f"eagle3 T={temperature} top_p={top_p}: chi2={stat:.1f} df={df} p={p:.3g} accepted={accepted}")
    assert accepted >= law.N_SAMPLES // 8, f"too few accepted drafts ({accepted})"
    assert int(counts[joint == 0].sum()) == 0, "sampled a sequence outside top-p"
    assert p > law.ALPHA_FAIR, f"EAGLE-3 speculative sampling differs from the AR law: p={p:.3g}"
