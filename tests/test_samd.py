"""SAM-Decoding: the suffix automaton against brute force, the official selection between the
automata and the auxiliary drafter, the auxiliary built by name through the registry's lookup,
greedy output equal to AR with drafts accepted (recycling, EAGLE-2 and no auxiliary; tiny
target; `-m smollm2`: real prompts), and EAGLE-2's tree sizer left untouched by steps it did not
size. Lossless sampling: tests/test_training_free_law.py."""
from __future__ import annotations

import random

import pytest
import torch

from harness.core.cost_model import TreeSizer
from harness.core.decode import DraftContext, GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.tree import DraftTree
from harness.core.verify import Sampling
from methods.common.base import Drafter
from methods.common.token_index import TokenIndex
from methods.registry import get_method
from methods.samd import SamDecoding, SuffixAutomaton
from tests.real_prompts import greedy_tau
from tests.test_exactness import prompts


def first_occurrence_end(text: list[int], pattern: list[int]) -> int | None:
    """The index where the first occurrence of `pattern` in `text` ends, or None."""
    n = len(pattern)
    return next((i + n - 1 for i in range(len(text) - n + 1) if text[i:i + n] == pattern), None)


def test_suffix_automaton_finds_the_longest_earlier_match():
    rng = random.Random(0)
    for _ in range(30):
        sam, text = SuffixAutomaton(), []
        for _ in range(80):
            root = rng.randrange(3)
            state, length = sam.match_after(root)
            ctx = text + [root]
            want = max((n for n in range(1, len(ctx) + 1) if first_occurrence_end(text, ctx[-n:]) is not None),
                       default=0)
            assert length == want
            if want:
                assert sam.first_end[state] == first_occurrence_end(text, ctx[-want:])
                assert sam.continuation(state, 3) == text[sam.first_end[state] + 1: sam.first_end[state] + 4]
            text.append(root)
            sam.extend(root)


def test_earlier_moves_to_a_shorter_match_with_room_after_it():
    """Official `to_anc`: '0 7 1' + root 2 first occurred ending at index 9, 4 tokens before the end;
    asked for 5, the shorter suffix '1 2' (its suffix link), first ending at index 1, is used."""
    sam = SuffixAutomaton()
    for t in [1, 2, 0, 0, 0, 0, 0, 7, 1, 2, 3, 0, 7, 1]:
        sam.extend(t)
    state, length = sam.match_after(2)
    assert length == 4 and sam.first_end[state] == 9
    assert sam.earlier(state, 4) == state and sam.continuation(state, 4) == [3, 0, 7, 1]
    shorter = sam.earlier(state, 5)
    assert sam.length[shorter] == 2 and sam.first_end[shorter] == 1
    assert sam.continuation(shorter, 5) == [0, 0, 0, 0, 0]
    assert sam.earlier(sam.match_after(0)[0], 100) != 0   # never the empty match


class FixedAux(Drafter):
    """An auxiliary that always proposes the chain [root, 42] and counts what it is told."""

    name = "fixed-aux"

    def __init__(self, target, config=None):
        super().__init__(target, config)
        self.calls = {"begin": 0, "propose": 0, "observe": 0}

    def begin(self, prompt, prefill, root):
        self.calls["begin"] += 1

    def propose(self, ctx):
        self.calls["propose"] += 1
        return DraftTree.chain(ctx.root, [42])

    def observe(self, step):
        self.calls["observe"] += 1


def propose_after(d: SamDecoding, tokens: list[int], room: int = 60) -> DraftTree:
    d.begin(torch.tensor(tokens[:-1]), None, tokens[-1])
    return d.propose(DraftContext(list(tokens), tokens[-1], Sampling(), None, room))


def test_selection_between_the_automata_and_the_auxiliary(tiny_target, tmp_path):
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    aux = FixedAux(tiny_target)
    d = SamDecoding(tiny_target, {"corpus": "none", "n_predicts": 4}, aux=aux)
    # dynamic match of 5 (1 2 3 4 5 after the text): the chain after its first occurrence, 3 tokens
    assert propose_after(d, text + [1, 2, 3, 4, 5]).tokens.tolist() == [5, 6, 7, 8]
    # a match of 4 is below len_threshold 5: the auxiliary's tree
    assert propose_after(d, text + [1, 2, 3, 4]).tokens.tolist() == [4, 42] and aux.calls["propose"] == 1
    # the static match counts len_bias (5) less: 9 tokens in the corpus lose to the auxiliary, 10 win
    TokenIndex.build([list(range(30, 45)) + [60, 61]], {"vocab_hash": tiny_target.vocab_hash()}).save(tmp_path / "c")
    s = SamDecoding(tiny_target, {"corpus": str(tmp_path / "c"), "n_predicts": 4}, aux=aux)
    assert propose_after(s, [0] + list(range(30, 39))).tokens.tolist() == [38, 42]
    assert propose_after(s, [0] + list(range(30, 40))).tokens.tolist() == [39, 40, 41, 42]
    # without an auxiliary: the dynamic chain has min(n_predicts - 1, alpha * match) tokens
    n = SamDecoding(tiny_target, {"corpus": "none", "aux": "none", "alpha": 1.0})
    assert propose_after(n, text + [1, 2]).tokens.tolist() == [2, 3, 4]
    assert propose_after(n, [50, 51]).size == 0
    # ... and a longer static match grows a tree from the corpus counts
    TokenIndex.build([[7, 8, 1], [7, 8, 1], [7, 8, 2], [7, 8, 1, 3]], {"vocab_hash": tiny_target.vocab_hash()}).save(
        tmp_path / "t")
    t = SamDecoding(tiny_target, {"corpus": str(tmp_path / "t"), "aux": "none", "alpha": 2.0})
    tree = propose_after(t, [5, 7, 8])   # the static match '7 8' (4 times): 1 (3 times), then 1 -> 3, 2
    assert tree.tokens.tolist() == [8, 1, 2, 3] and tree.parents.tolist() == [-1, 0, 0, 1]


def test_the_auxiliary_is_built_by_name_and_told_every_step(tiny_target):
    d = get_method("samd").create(tiny_target, {"corpus": "none", "budget": 7})
    assert type(d.aux).__name__ == "TokenRecycling" and d.aux.tree.max_depth <= 7 and len(d.aux.tree.nodes) == 7
    assert d.chain_limit() == 7
    with pytest.raises(SpecbenchError, match="another method"):
        SamDecoding(tiny_target, {"corpus": "none", "aux": "samd"})
    with pytest.raises(SpecbenchError, match="unknown method 'recyling'"):
        SamDecoding(tiny_target, {"corpus": "none", "aux": "recyling"})
    aux = FixedAux(tiny_target)
    d = SamDecoding(tiny_target, {"corpus": "none"}, aux=aux)
    gen = generate(tiny_target, prompts(tiny_target.vocab_size, 1)[0], GenerationConfig(24), d)
    assert aux.calls["begin"] == 1 and aux.calls["observe"] == len(gen.tokens) and aux.calls["propose"] >= 1


@pytest.mark.parametrize("aux", ["recycling", "none", "eagle2"])
def test_greedy_samd_equals_ar_with_drafts_accepted(tiny_target, tmp_path, aux):
    """A corpus of the target's own text for some prompts, so all three sources draft."""
    cfg = GenerationConfig(max_new_tokens=48)
    ps = prompts(tiny_target.vocab_size, n=8)
    ars = [generate(tiny_target, p, cfg).output_ids for p in ps]
    TokenIndex.build([p + a for p, a in zip(ps[::3], ars[::3])], {"vocab_hash": tiny_target.vocab_hash()}).save(
        tmp_path / "c")
    config = {"corpus": str(tmp_path / "c"), "aux": aux}
    if aux == "eagle2":  # random EAGLE-2 weights, handed over (none are trained for the tiny target)
        torch.manual_seed(0)
        handed = get_method("eagle2")(tiny_target, {"total_tokens": 8, "draft_vocab": 0}).eval()
        d = SamDecoding(tiny_target, config, aux=handed)
    else:
        d = SamDecoding(tiny_target, config)
    accepted = 0
    for i, p in enumerate(ps):
        sp = generate(tiny_target, p, cfg, d)
        assert sp.output_ids == ars[i], f"prompt {i}: samd ({aux}) diverged from AR"
        accepted += sum(sp.accepted)
    assert accepted >= 40, accepted


def test_a_sizer_learns_only_from_trees_it_sized():
    sizer = TreeSizer([[1, 1.0], [64, 2.0]], max_keep=8)
    before = sizer.calibration
    sizer.observe(5)                     # a step drafted by someone else: no budget was asked
    assert sizer.calibration == before
    sizer.budget([-0.1, -0.2])
    sizer.observe(2)
    assert sizer.calibration != before


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.parametrize("aux", ["recycling", "eagle2"])
def test_samd_on_smollm2_equals_ar_and_accepts(smollm2_fp32, shared_data, aux):
    """The committed EAGLE weights as the auxiliary (eagle2), or Token Recycling; no corpus."""
    d = get_method("samd").create(smollm2_fp32, {"aux": aux, "corpus": "none"})
    assert greedy_tau(smollm2_fp32, shared_data, d) > 1.3
