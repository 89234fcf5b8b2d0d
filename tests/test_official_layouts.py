"""Official Medusa and Hydra checkpoint layouts: synthetic state dicts with the released key names
and shapes (tiny dims) round-trip into our models; Vicuna-7B sizes checked on the meta device."""
from __future__ import annotations

import pytest
import torch

from harness.testing.official_states import hydra_official_state, medusa_official_state
from methods.hydra import Hydra
from methods.medusa import Medusa
from tests.train_helpers import vicuna7b_meta


def test_medusa_official_layout_loads(tiny_target, tmp_path):
    h, v = tiny_target.hidden_size, tiny_target.vocab_size
    st = medusa_official_state(h, v)
    assert len(st) == 15
    torch.save(st, tmp_path / "medusa_lm_head.pt")
    d = Medusa.from_pretrained(tmp_path, tiny_target)
    assert d.config["heads"] == 5 and d.config["layers"] == 1 and not d.config["share_lm_head"]
    assert torch.equal(d.medusa_head[3][0].linear.weight, st["3.0.linear.weight"])
    assert torch.equal(d.medusa_head[4][1].weight, st["4.1.weight"])
    f = torch.randn(h)
    assert torch.allclose(d.head_logits(2, f), st["2.1.weight"] @ (f + torch.nn.functional.silu(
        st["2.0.linear.weight"] @ f + st["2.0.linear.bias"])), atol=1e-4)


def test_hydra_official_layout_loads(tiny_target, tmp_path):
    cfg = tiny_target.config
    st = hydra_official_state(cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.num_attention_heads,
                              cfg.num_key_value_heads)
    assert len(st) == 12 + 1 + 4 * 12
    torch.save(st, tmp_path / "hydra_lm_head.pt")
    d = Hydra.from_pretrained(tmp_path, tiny_target)
    assert (d.config["heads"], d.config["layers"], d.config["share_lm_head"]) == (4, 4, False)
    w = st["hydra_mlp.2.3.linear.weight"]
    for j in (3, 5, 7):  # the shared official block is copied into each distinct block
        assert torch.equal(d.hydra_head[2].body[j].linear.weight, w)
    assert torch.equal(d.prefix.layers[0].mlp.up_proj.weight, st["prefix_embeding_layer.layers.0.mlp.up_proj.weight"])
    assert torch.equal(d.hydra_head[1].proj.bias, st["hydra_lm_head.1.1.bias"])
    del st["hydra_mlp.0.1.res_connection.bias"]
    torch.save(st, tmp_path / "hydra_lm_head.pt")
    with pytest.raises(Exception, match="do not fit"):
        Hydra.from_pretrained(tmp_path, tiny_target)


def test_vicuna7b_sizes():
    m = vicuna7b_meta(Medusa, lambda d, t: Medusa.__init__(d, t, {"share_lm_head": False}))
    assert len(m.state_dict()) == 15
    per_head = sum(p.numel() for p in m.medusa_head[0].parameters())
    assert per_head == 147_853_312  # H^2 + H + H*V: ~147.9 M per head
    h = vicuna7b_meta(Hydra, lambda d, t: Hydra.__init__(d, t, {"share_lm_head": False}))
    # ours: 10 prefix keys + 4 x 12 head keys; the release adds embed_tokens, inv_freq, input_embed_fn.
    assert len(h.state_dict()) + 3 == 61
    prefix = sum(p.numel() for p in h.prefix.parameters())
    assert prefix == 202_387_456  # one Llama-7B layer (202,383,360) + final norm; the release adds a
    assert abs(prefix + 32000 * 4096 - 333.5e6) < 0.1e6  # never-trained embedding: "333.5 M" in checkpoints.md
    heads = sum(p.numel() for p in h.hydra_head.parameters())
    shared_extra = 4 * 2 * (4096 * 4096 + 4096)  # ours are distinct; the release shares 3 blocks as one
    assert abs(heads - shared_extra - 1061.3e6) < 0.1e6
