"""The tiny random Llama: a target of a few layers and a small vocabulary, seeded, with no tokenizer.

It is what the tests run on and what `cli.py check-method --target tiny` checks a drafter on in
seconds: exactness, the lossless law and the tree contract do not depend on a good model. Its
prompts are token ids (there is no text). `Target.load("tiny")` wraps it as a Target (this module
knows no Target, so the two import in one direction only), so a drafter that loads a draft model
by name (SpS: `--set draft=tiny`) gets an identical twin.
"""
from __future__ import annotations

import torch

TINY_ALIAS = "tiny"


def tiny_llama(vocab: int = 96, hidden: int = 64, layers: int = 2, seed: int = 0):
    """A random LlamaForCausalLM (float32, eval), its LM head sharpened so greedy text is not a
    flat tie-fest and sampling has structure; no EOS, so answers run to the token limit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model

