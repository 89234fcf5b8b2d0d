"""Token Recycling: the adjacency rows it writes from a verify (every node's top-k, the accepted
path's winning), the template it fills, per-answer or kept state, and greedy output equal to AR
with drafts accepted (tiny target; `-m smollm2`: real prompts). Lossless sampling:
tests/test_training_free_law.py."""
from __future__ import annotations

import pytest
import torch

from harness.core.decode import Acceptance, DraftContext, GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.tree import DraftTree
from harness.core.verify import Sampling
from methods.recycling import TREE_222, TREE_SAMD, TokenRecycling
from tests.real_prompts import greedy_tau
from tests.test_exactness import prompts


def step_of(tree: DraftTree, path: list[int], logits: torch.Tensor) -> Acceptance:
    """The Acceptance the loop would build for `path` through `tree` with target logits [N+1, V]."""
    rows = torch.tensor(path)
    return Acceptance(tree, path, tree.tokens[path], torch.zeros(len(path), 4), 0, logits[rows], None, tree_logits=logits)


def test_the_templates_are_the_official_ones():
    for choices, nodes, depth, rank in ((TREE_222, 80, 6, 7), (TREE_SAMD, 60, 5, 6)):
        assert len(choices) == nodes and len({tuple(c) for c in choices}) == nodes
        assert max(map(len, choices)) == depth and max(c[-1] for c in choices) == rank


@pytest.mark.parametrize("update", ["tree", "context"])
def test_observe_writes_top_k_rows_and_the_path_wins(tiny_target, update):
    """Tree: root 10 -> (11 -> 12), (12); the accepted path is 10 -> 11 -> 12 (nodes 0, 1, 2), and token
    12 also sits at the rejected node 3, so its row must come from the path's node 2. Then a step
    whose path is the root alone: its rejected node 11 (a token of the text) overwrites 11's row
    in "tree" mode only; the new token 21 gets a row in both."""
    d = TokenRecycling(tiny_target, {"update": update, "topk": 3, "tree": [[0], [1], [2]]})
    tree = DraftTree(torch.tensor([10, 11, 12, 12]), torch.tensor([-1, 0, 1, 0]))
    logits = torch.randn(4, tiny_target.vocab_size, generator=torch.Generator().manual_seed(0))
    d.observe(step_of(tree, [0, 1, 2], logits))
    top = logits.topk(3, dim=-1).indices
    for node, token in ((0, 10), (1, 11), (2, 12)):
        assert d.adjacency[token].tolist() == top[node].tolist()
    assert d.seen.nonzero().flatten().tolist() == [10, 11, 12]
    tree2 = DraftTree(torch.tensor([10, 11, 21]), torch.tensor([-1, 0, 0]))
    logits2 = torch.randn(3, tiny_target.vocab_size, generator=torch.Generator().manual_seed(1))
    top2 = logits2.topk(3, dim=-1).indices
    d.observe(step_of(tree2, [0], logits2))
    assert d.adjacency[11].tolist() == (top2[1] if update == "tree" else top[1]).tolist()
    assert d.adjacency[21].tolist() == top2[2].tolist() and d.adjacency[10].tolist() == top2[0].tolist()


def test_context_mode_seeds_the_prompt_rows_from_the_prefill(tiny_target):
    """Each prompt token's row is the target's top-k at its last occurrence in the prompt."""
    d = TokenRecycling(tiny_target, {"topk": 4, "tree": [[0]]})
    prompt = torch.tensor([5, 6, 5, 7])
    hidden = torch.randn(4, tiny_target.hidden_size, generator=torch.Generator().manual_seed(2))
    d.begin(prompt, type("Prefill", (), {"hidden": hidden})(), root=8)
    top = tiny_target.project(hidden).topk(4, dim=-1).indices
    assert d.adjacency[5].tolist() == top[2].tolist() and d.adjacency[6].tolist() == top[1].tolist()
    assert d.adjacency[7].tolist() == top[3].tolist()
    assert d.seen.nonzero().flatten().tolist() == [5, 6, 7]
    tree_mode = TokenRecycling(tiny_target, {"topk": 4, "tree": [[0]], "update": "tree"})
    tree_mode.begin(prompt, None, root=8)
    assert not tree_mode.seen.any()


def test_propose_walks_the_template_through_the_rows(tiny_target):
    """Children are a token's row in rank order; an unseen token has none; depth stops at the room."""
    d = TokenRecycling(tiny_target, {"tree": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], "topk": 2})
    d.adjacency[5] = torch.tensor([6, 7])
    d.adjacency[6] = torch.tensor([8, 9])
    d.seen[[5, 6]] = True                      # 7, 8, 9 unseen: no children
    ctx = DraftContext([1, 5], 5, Sampling(), None, max_nodes=10)
    tree = d.propose(ctx)
    assert tree.tokens.tolist() == [5, 6, 7, 8, 9] and tree.parents.tolist() == [-1, 0, 0, 1, 1]
    shallow = d.propose(DraftContext([1, 5], 5, Sampling(), None, max_nodes=2))
    assert shallow.tokens.tolist() == [5, 6, 7]


def test_a_template_deeper_than_topk_is_refused(tiny_target):
    with pytest.raises(SpecbenchError, match="raise --set recycling.topk"):
        TokenRecycling(tiny_target, {"topk": 4})
    with pytest.raises(SpecbenchError, match="update=.path. is not one of context, tree"):
        TokenRecycling(tiny_target, {"update": "path"})


@pytest.mark.parametrize("keep", [False, True])
def test_begin_resets_the_matrix_unless_kept(tiny_target, keep):
    d = TokenRecycling(tiny_target, {"keep_across_answers": keep, "update": "tree"})
    d.seen[3] = True
    d.begin(torch.tensor([1, 2]), None, 3)
    assert bool(d.seen[3]) == keep


@pytest.mark.parametrize("config", [{}, {"update": "tree"}, {"keep_across_answers": True}, {"tree": "samd"}])
def test_greedy_recycling_equals_ar_with_drafts_accepted(tiny_target, config):
    d = TokenRecycling(tiny_target, config)
    seen_rows = []
    real_observe = d.observe

    def observe(step):  # the loop hands over every verified node's logits
        seen_rows.append(step.tree_logits.shape == (step.tree.tokens.numel(), tiny_target.vocab_size))
        real_observe(step)

    d.observe = observe
    cfg = GenerationConfig(max_new_tokens=48)
    accepted = drafted = 0
    for i, p in enumerate(prompts(tiny_target.vocab_size, n=8)):
        ar = generate(tiny_target, p, cfg)
        sp = generate(tiny_target, p, cfg, d)
        assert sp.output_ids == ar.output_ids, f"prompt {i}: recycling diverged from AR ({config})"
        accepted += sum(sp.accepted)
        drafted += sum(sp.tree_size)
    assert seen_rows and all(seen_rows)
    assert accepted >= 40, (accepted, drafted)


@pytest.mark.slow
@pytest.mark.smollm2
def test_recycling_on_smollm2_equals_ar_and_accepts(smollm2_fp32, shared_data):
    assert greedy_tau(smollm2_fp32, shared_data, TokenRecycling(smollm2_fp32)) > 1.3
