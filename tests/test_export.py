"""`cli.py export METHOD --layout official`: a briefly trained drafter of every learned method is
written in its paper's layout and read back by our official-layout loader, on the tiny target.

Per method: (1) the file holds exactly the tensors the official module has, name for name and
shape for shape (the key sets below are read off the official code, file:line, not off our map:
several official loaders load non-strictly, so a missing or misnamed key would pass unseen
there); (2) the loaded drafter has the same weights as ours configured as the layout expresses
it (EAGLE without its draft vocabulary, Medusa/Hydra with the target's head as their own
projections, Hydra's later blocks as one); (3) both decode step by step alike in float32 at
T = 0: the same draft tree at every step, the same tree sizes and accepted counts, the same
tokens (greedy output alone would prove nothing: it equals the target's for any drafter)."""
from __future__ import annotations

import json
import pytest
import torch
from safetensors.torch import load_file

from harness.core.decode import GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.peers.export import export_drafter
from methods.registry import get_method
from tests.conftest import make_tiny_target
from tests.test_eagle3 import eagle3_dataset
from tests.train_helpers import tiny_dataset, tiny_prompts, train_quickly

DRAFT_VOCAB = 48  # of the tiny target's 96 ids
# What each method is trained with here, and the fixed tree it decodes with (no cost curve is measured).
ARCH = {"eagle": {}, "eagle2": {}, "eagle3": {"ttt_steps": 2}, "medusa": {}, "hydra": {},
        "gumiho": {"mlp_ce_from_epoch": 0}}
DECODE = {"eagle": {}, "eagle2": {"total_tokens": 16}, "eagle3": {"total_tokens": 16}, "medusa": {"tree": "cpu_15"},
          "hydra": {"tree": "cpu_15"}, "gumiho": {"total_tokens": 16}}


@pytest.fixture(scope="module")
def targets():
    return {2: make_tiny_target(), 7: make_tiny_target(layers=7)}


def target_for(method: str, targets):
    return targets[7 if method == "eagle3" else 2]


@pytest.fixture(scope="module")
def committed(targets, tmp_path_factory):
    """method -> a specbench checkpoint folder of a drafter trained for a few seconds with a pruned
    draft vocabulary (made on first use)."""
    made: dict[str, object] = {}
    data: dict[int, object] = {}

    def get(method: str):
        if method not in made:
            target = target_for(method, targets)
            cls = get_method(method)
            drafter = cls(target, {"draft_vocab": DRAFT_VOCAB, **ARCH[method]})
            if method == "eagle3":
                dataset = eagle3_dataset(target, drafter.target_layers())
            else:
                if 2 not in data:
                    data[2] = tiny_dataset(target)
                dataset = data[2]
            drafter.set_draft_vocab(torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(3))
                                    [:DRAFT_VOCAB])
            train_quickly(drafter, dataset, tmp_path_factory.mktemp(f"{method}-train"), steps=60, lr=1e-2)
            folder = tmp_path_factory.mktemp(f"{method}-ck")
            drafter.save_pretrained(folder)
            made[method] = folder
        return made[method]

    return get


# ---- the official modules' tensors, read off their code -------------------------------------
def llama_layer(prefix: str, h: int, i: int, nh: int, nkv: int, q_in: int, input_norm: bool) -> dict[str, tuple]:
    """One Llama decoder layer of the official copies (q/k/v without bias, head_dim = h / nh)."""
    hd = h // nh
    out = {f"{prefix}self_attn.q_proj.weight": (nh * hd, q_in), f"{prefix}self_attn.k_proj.weight": (nkv * hd, q_in),
           f"{prefix}self_attn.v_proj.weight": (nkv * hd, q_in), f"{prefix}self_attn.o_proj.weight": (h, nh * hd),
           f"{prefix}mlp.gate_proj.weight": (i, h), f"{prefix}mlp.up_proj.weight": (i, h),
           f"{prefix}mlp.down_proj.weight": (h, i), f"{prefix}post_attention_layernorm.weight": (h,)}
    if input_norm:
        out[f"{prefix}input_layernorm.weight"] = (h,)
    return out


def official_module_keys(method: str, target, drafter) -> dict[str, tuple]:
    """name -> shape of every tensor in the official module's state dict for this drafter's sizes."""
    cfg = target.config
    h, v, i, nh, nkv = cfg.hidden_size, target.vocab_size, cfg.intermediate_size, cfg.num_attention_heads, \
        cfg.num_key_value_heads
    if method in ("eagle", "eagle2", "gumiho"):
        # Spec-Bench model/eagle2/cnets.py:471-515 (model/eagle/cnets.py:454-495, SafeAILab/EAGLE
        # eagle/model/cnets1.py:472-527 alike): embed_tokens, layers (index 0 without input_layernorm,
        # :388-392), fc with bias (config `bias`, default true); inv_freq is not persistent (:116).
        # Gumiho (gumiho/model/cnets.py:541-590) adds mlp.{i}: a 2H -> H block without residual and
        # five H -> H ResBlocks (:495-531), whose res_connection is an Identity.
        layers = drafter.config["layers"]
        keys = {"embed_tokens.weight": (v, h), "fc.weight": (h, 2 * h), "fc.bias": (h,)}
        for n in range(layers):
            keys.update(llama_layer(f"layers.{n}.", h, i, nh, nkv, h, input_norm=n != 0))
        if method == "gumiho":
            for head in range(drafter.config["mlp_heads"]):
                keys.update({f"mlp.{head}.0.linear.weight": (h, 2 * h), f"mlp.{head}.0.linear.bias": (h,)})
                for j in range(1, 6):
                    keys.update({f"mlp.{head}.{j}.linear.weight": (h, h), f"mlp.{head}.{j}.linear.bias": (h,)})
        return keys
    if method == "eagle3":
        # SafeAILab/EAGLE eagle/model/cnets.py:478-545: embed_tokens, lm_head over the draft vocab,
        # midlayer (q/k/v read 2H: :233-235; hidden_norm and input_layernorm: :395-396), fc 3H -> H
        # without bias (:531-534), norm, and the d2t / t2d buffers (:538-541).
        vd = drafter.draft_vocab_size
        keys = {"embed_tokens.weight": (v, h), "lm_head.weight": (vd, h), "fc.weight": (h, 3 * h), "norm.weight": (h,),
                "d2t": (vd,), "t2d": (v,), "midlayer.hidden_norm.weight": (h,)}
        keys.update(llama_layer("midlayer.", h, i, nh, nkv, 2 * h, input_norm=True))
        return keys
    if method == "medusa":
        # medusa/model/medusa_model.py:111-119: per head, L ResBlocks then a bias-free H -> V Linear.
        layers, keys = drafter.config["layers"], {}
        for head in range(5):  # five heads, whatever the config says (:143)
            for j in range(layers):
                keys.update({f"{head}.{j}.linear.weight": (h, h), f"{head}.{j}.linear.bias": (h,)})
            keys[f"{head}.{layers}.weight"] = (v, h)
        return keys
    # Hydra: hydra/model/hydra_heads/prefix_mlp_head.py:53-100 with its prefix LlamaModel
    # (hydra/model/modeling_llama_kv.py:859-876: embed_tokens, layers, norm; inv_freq persistent, :158).
    hd = h // nh
    keys = {"prefix_embeding_layer.embed_tokens.weight": (v, h), "prefix_embeding_layer.norm.weight": (h,),
            "prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq": (hd // 2,), "input_embed_fn.weight": (v, h)}
    keys.update(llama_layer("prefix_embeding_layer.layers.0.", h, i, nh, nkv, h, input_norm=True))
    for head in range(drafter.config["heads"]):
        width = (head + 2) * h  # ResBlock(hidden, head + 1) at index 1 (:82), with res_connection (:24)
        keys.update({f"hydra_mlp.{head}.1.linear.weight": (h, width), f"hydra_mlp.{head}.1.linear.bias": (h,),
                     f"hydra_mlp.{head}.1.res_connection.weight": (h, width),
                     f"hydra_mlp.{head}.1.res_connection.bias": (h,),
                     f"hydra_lm_head.{head}.1.weight": (v, h), f"hydra_lm_head.{head}.1.bias": (v,)})
        for j in range(3, 2 * drafter.config["layers"], 2):  # (Dropout, ResBlock) * (L - 1) (:83)
            keys.update({f"hydra_mlp.{head}.{j}.linear.weight": (h, h), f"hydra_mlp.{head}.{j}.linear.bias": (h,)})
    return keys


# ---- ours, as the official layout expresses it -------------------------------------------------
def official_form(method: str, target, folder):
    """Our drafter from the specbench checkpoint `folder`, configured as the official layout
    expresses it, built without the export: no draft vocabulary (EAGLE-3 keeps its d2t/t2d), and
    Hydra's later ResBlocks all set to the first of them (the official head repeats one block)."""
    cls = get_method(method)
    meta = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    arch = dict(meta["arch"])
    if method != "eagle3":
        state.pop("draft_ids")
        arch["draft_vocab"] = 0
    drafter = cls(target, {**arch, **DECODE[method]})
    drafter.load_state_dict(state)
    if method == "hydra":
        with torch.no_grad():
            for head in drafter.hydra_head:
                for j in range(5, len(head.body), 2):
                    head.body[j].load_state_dict(head.body[3].state_dict())
    return drafter.to(dtype=target.dtype).eval()


def decode_steps(target, drafter, prompts: list[list[int]]) -> list[dict]:
    """Per prompt: output ids, per-step tree sizes and accepted counts, and every proposed tree."""
    out = []
    propose = drafter.propose
    for prompt in prompts:
        trees = []

        def recorded(ctx):
            tree = propose(ctx)
            trees.append((tree.tokens.tolist(), tree.parents.tolist()))
            return tree

        drafter.propose = recorded
        gen = generate(target, prompt, GenerationConfig(40), drafter)
        out.append({"ids": gen.output_ids, "tree_size": gen.tree_size, "accepted": gen.accepted, "trees": trees})
    drafter.propose = propose
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle", "eagle2", "eagle3", "medusa", "hydra", "gumiho"])
def test_export_loads_back_as_the_same_drafter(method, targets, committed, tmp_path):
    target = target_for(method, targets)
    done = export_drafter(method, target, tmp_path / "official", checkpoint=str(committed(method)))
    files = {p.name for p in done.files}
    state = torch.load(next(p for p in done.files if p.name != "config.json"), weights_only=True)
    ref = official_form(method, target, committed(method))
    # (1) every tensor of the official module, and nothing else, at its shape
    assert {k: tuple(t.shape) for k, t in state.items()} == official_module_keys(method, target, ref)
    assert "config.json" in files and len(files) == 2
    # (2) the same weights
    loaded = get_method(method).from_pretrained(tmp_path / "official", target, DECODE[method])
    ours, theirs = ref.state_dict(), loaded.state_dict()
    assert set(ours) <= set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    for k in set(theirs) - set(ours):  # Medusa's and Hydra's own projections: the target's head
        want = target.lm_head.weight if k.endswith("weight") else torch.zeros(target.vocab_size)
        assert k.endswith((".proj.weight", ".proj.bias", f".{ref.config.get('layers')}.weight")), k
        assert torch.equal(theirs[k], want), k
    # (3) the same decoding, step by step
    prompts = tiny_prompts(target.vocab_size, 4, seed=11)
    a, b = decode_steps(target, ref, prompts), decode_steps(target, loaded, prompts)
    assert a == b
    assert sum(sum(x["accepted"]) for x in a) > 0  # drafts were accepted: the commit paths ran too


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "hydra", "gumiho"])
def test_export_records_its_departures_in_config(method, targets, committed, tmp_path):
    target = target_for(method, targets)
    done = export_drafter(method, target, tmp_path, checkpoint=str(committed(method)), base_model="BASE")
    cfg = json.loads((tmp_path / "config.json").read_text())
    record = cfg["specbench_export"]
    assert record["departures"] == done.departures
    assert record["method"] == method and record["weights_hash"]
    vocab = [d for d in done.departures if d.startswith("draft vocabulary")]
    assert len(vocab) == (0 if method == "eagle3" else 1)
    if method in ("medusa", "hydra"):
        assert cfg["base_model_name_or_path"] == "BASE" and "model_type" not in cfg
        assert any(d.startswith("vocab projection") for d in done.departures)
    if method == "hydra":  # four layers: three later blocks, one official block
        assert any(d.startswith("ResBlocks: ours 3 distinct") for d in done.departures)
    if method in ("eagle", "eagle3", "gumiho"):
        assert cfg["rope_theta"] == 10000.0 and cfg["hidden_size"] == target.hidden_size
    if method == "eagle3":
        assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    if method in ("eagle", "gumiho"):
        assert cfg["bias"] is True


def test_layouts_it_cannot_express_are_refused(targets, committed):
    target = targets[2]
    gumiho = get_method("gumiho")(target, {"draft_vocab": 0, "mlp_blocks": 3})
    with pytest.raises(SpecbenchError, match="mlp_blocks=3 has no official layout"):
        gumiho.official_files()
    eagle3 = get_method("eagle3")(targets[7], {"draft_vocab": 0, "fuse_layers": "high"})
    with pytest.raises(SpecbenchError, match="fuse_layers=high has no official layout"):
        eagle3.official_files()
    with pytest.raises(SpecbenchError, match="training-free"):
        export_drafter("pld", target, "unused")


def test_the_rope_base_spec_bench_eagle1_ignores_is_a_departure(targets):
    """On a target whose RoPE base is not 10,000 (SmolLM2's is 100,000), EAGLE-1's export says that
    Spec-Bench's EAGLE-1 draft cannot take it; EAGLE-2's, which reads rope_theta, does not."""
    from transformers import LlamaConfig

    from harness.core.target import Target
    from harness.testing.hub_layouts import random_model

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rope_theta=100000.0)
    target = Target(random_model(cfg, 0), None, "theta-1e5", torch.device("cpu"), torch.float32)
    eagle = get_method("eagle")(target, {"draft_vocab": 0}).official_files()
    assert eagle.config["rope_theta"] == 100000.0
    assert [d for d in eagle.departures if d.startswith("RoPE base: ours 100,000")]
    assert not get_method("eagle2")(target, {"draft_vocab": 0}).official_files().departures


def test_cli_export_writes_the_official_files(committed, tmp_path):
    """`cli.py export` end to end on the tiny target: the files, one line per departure; bad input
    is one line and exit 2."""
    from typer.testing import CliRunner

    from cli import app

    args = ["export", "medusa", "--target", "tiny", "--checkpoint", str(committed("medusa"))]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [ln for ln in lines if ln.startswith("wrote ")] == [f"wrote {tmp_path / 'out' / f}"
                                                                for f in ("medusa_lm_head.pt", "config.json")]
    assert sum(ln.startswith("departure: ") for ln in lines) == 2  # its own projections; the draft vocabulary
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x"), "--layout", "hub"])
    assert result.exit_code == 2 and "unknown layout 'hub'" in result.output
