"""The base model view (harness/peers/base_view.py): a transformers 5 folder rewritten so the
peers' transformers 4.37 / 4.50 read it as it is meant, checked on a small hub-format Llama with
SmolLM2's RoPE base (100,000) and tied embeddings."""
from __future__ import annotations

import json
import os

import pytest
import torch

from harness.core.errors import SpecbenchError
from harness.peers.base_view import legacy_config, legacy_tokenizer, safetensors_names, write_base_view

THETA = 100000.0


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from transformers import LlamaConfig

    from harness.testing.hub_layouts import write_hub_target

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rope_theta=THETA, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)
    return write_hub_target(tmp_path_factory.mktemp("hub"), cfg)


def read(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def rope_base_read_by_4x(config: dict) -> float:
    """How LlamaConfig of transformers 4.37 / 4.50 takes the RoPE base: its `rope_theta` argument,
    10,000 when absent (it does not know `rope_parameters`)."""
    return float(config.get("rope_theta", 10000.0))


def test_the_view_says_the_rope_base_the_older_versions_read(source, tmp_path):
    view = write_base_view(source, tmp_path / "view")
    src_cfg, cfg = read(source / "config.json"), read(view / "config.json")
    assert rope_base_read_by_4x(src_cfg) == 10000.0  # what they make of transformers 5's own file
    assert rope_base_read_by_4x(cfg) == THETA
    assert "rope_parameters" not in cfg and cfg["rope_scaling"] is None
    assert cfg["torch_dtype"] == "float32" and "dtype" not in cfg
    assert cfg["tie_word_embeddings"] is True and cfg["architectures"] == ["LlamaForCausalLM"]


def test_the_view_holds_the_weights_an_index_and_a_tokenizer_every_version_knows(source, tmp_path):
    view = write_base_view(source, tmp_path / "view")
    index = read(view / "model.safetensors.index.json")
    names = safetensors_names(source / "model.safetensors")
    assert "model.embed_tokens.weight" in names  # EAGLE's drafts read it through the index
    assert index["weight_map"] == {n: "model.safetensors" for n in names}
    assert os.path.samefile(view / "model.safetensors", source / "model.safetensors") or \
        (view / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    tok = read(view / "tokenizer_config.json")
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and tok["unk_token"] == "w0"
    assert tok["chat_template"] == (source / "chat_template.jinja").read_text(encoding="utf-8")
    assert read(view / "tokenizer.json") == read(source / "tokenizer.json")  # word-level: nothing to rewrite


def test_bpe_merges_are_written_as_tokenizers_0_15_reads_them():
    """Newer tokenizers write a BPE merge as a pair, which tokenizers 0.15 (under transformers 4.37)
    fails to parse; the view writes "a b", which every version reads to the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "Ġ": 5, "Ġab": 6}
    tok = Tokenizer(models.BPE(vocab, [("a", "b"), ("ab", "c"), ("Ġ", "ab")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    data = json.loads(tok.to_str())
    assert data["model"]["merges"][0] == ["a", "b"]  # the pair form, as the installed tokenizers writes it
    legacy = legacy_tokenizer(data)
    assert legacy["model"]["merges"] == ["a b", "ab c", "Ġ ab"]
    again = Tokenizer.from_str(json.dumps(legacy))
    assert again.encode("abc ab").ids == tok.encode("abc ab").ids == [4, 6]
    data["model"]["merges"] = [["a b", "c"]]
    with pytest.raises(SpecbenchError, match="merges with a space"):
        legacy_tokenizer(data)


def test_the_view_is_the_same_model(source, tmp_path):
    """Read back (here by transformers 5): the same ids for a text, the same logits, RoPE base 100,000."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    view = write_base_view(source, tmp_path / "view")
    text = "w5 w17 w3 w90 w42"
    ids = AutoTokenizer.from_pretrained(view)(text)["input_ids"]
    assert ids == AutoTokenizer.from_pretrained(source)(text)["input_ids"] == [5, 17, 3, 90, 42]
    a = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(view, dtype=torch.float32).eval()
    assert b.config.rope_parameters["rope_theta"] == THETA
    with torch.no_grad():
        assert torch.equal(a(torch.tensor([ids])).logits, b(torch.tensor([ids])).logits)


def test_legacy_config_writes_scaling_and_refuses_what_4x_cannot_read(tmp_path):
    base = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}
    scaled = legacy_config({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}})
    assert scaled["rope_theta"] == 5e5
    assert scaled["rope_scaling"] == {"rope_type": "llama3", "type": "llama3", "factor": 8.0}
    assert legacy_config({"hidden_size": 64})["rope_theta"] == 10000.0  # the default, written out
    with pytest.raises(SpecbenchError, match="head_dim 32 is not hidden 64 / 4 heads"):
        legacy_config({**base, "head_dim": 32})
    with pytest.raises(SpecbenchError, match="not a Hugging Face model folder"):
        write_base_view(tmp_path / "missing", tmp_path / "view")


def test_the_module_imports_without_torch():
    """The peer runner imports it in any environment: no torch (nor transformers) at import."""
    import subprocess
    import sys

    code = "import sys, harness.peers.base_view; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
