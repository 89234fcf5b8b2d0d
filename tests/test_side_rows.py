"""Side rows (harness/core/tree.py: SideRows): extra rows a drafter runs in the verify forward or in the
prefill's, seen by no tree row, handed to the drafter, never kept in the cache; and the trie builder."""
from __future__ import annotations

import torch

from harness.core.decode import Answer, GenerationConfig, prefill, speculative_step
from harness.core.tree import DraftTree, SideRows, tree_from_parent_map
from harness.core.tree_build import trie_tree
from harness.core.verify import Sampling

ATOL = 1e-4  # two float32 computations of the same logits (tests/train_helpers.py says why)


def random_prompt(target, n: int, seed: int) -> list[int]:
    return torch.randint(0, target.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def causal_last_logits(target, ids: list[int]) -> torch.Tensor:
    """Logits [V] at the last of `ids`, by a plain causal forward from an empty cache."""
    return target.forward(torch.tensor(ids), target.new_cache(), logits="last").logits[-1]


class SideRowDrafter:
    """Proposes one fixed tree with three side rows and keeps what the loop hands back."""

    def __init__(self, nodes: list[int], parents: list[int], side: list[int]) -> None:
        self.nodes, self.parents, self.side = nodes, parents, side
        self.seen = None

    def rows(self, tree_nodes: int) -> SideRows:
        # row 0 at offset 1 sees the root; row 1 at offset 2 sees the root and row 0;
        # row 2 at offset 2 sees the root and draft node 1.
        mask = torch.zeros(3, 1 + tree_nodes + 3, dtype=torch.bool)
        mask[:, 0] = True
        mask[1, 1 + tree_nodes] = True
        mask[2, 1] = True
        mask[range(3), [1 + tree_nodes + i for i in range(3)]] = True
        return SideRows(torch.tensor(self.side), torch.tensor([1, 2, 2]), mask)

    def propose(self, ctx) -> DraftTree:
        tree = tree_from_parent_map(ctx.root, self.nodes, self.parents)
        return DraftTree(tree.tokens, tree.parents, side=self.rows(tree.size))

    def observe(self, step) -> None:
        self.seen = step


def test_side_rows_leave_the_tree_alone_and_reach_the_drafter(device_target):
    t = device_target
    prompt = random_prompt(t, 9, seed=5)
    cfg = GenerationConfig(max_new_tokens=16)
    cache, _, root = prefill(t, prompt, cfg, None)
    start = cache.length
    answer = Answer.begin(t, cfg, prompt, root)
    # draft node 1 is the target's own next token, so a path is accepted and committed
    first = int(causal_last_logits(t, prompt + [root]).argmax())
    drafter = SideRowDrafter([first, 7, 8], [0, 0, 1], [11, 12, 13])
    step = speculative_step(t, cache, drafter, answer, root, Sampling(), None, answer.room)

    plain = tree_from_parent_map(root, [first, 7, 8], [0, 0, 1])
    assert step.verified.logits.shape[0] == plain.size + 1
    for node, path in ((0, [root]), (1, [root, first]), (2, [root, 7]), (3, [root, first, 8])):
        assert torch.allclose(step.verified.logits[node], causal_last_logits(t, prompt + path), atol=ATOL)
    seen = drafter.seen.side_logits
    assert seen.shape == (3, t.vocab_size)
    for row, visible in ((0, [root, 11]), (1, [root, 11, 12]), (2, [root, first, 13])):
        assert torch.allclose(seen[row], causal_last_logits(t, prompt + visible), atol=ATOL), f"side row {row}"
    # the cache keeps the accepted path's rows only, never a side row
    assert step.verdict.path[:2] == [0, 1]
    assert cache.length == start + len(step.verdict.path)
    nxt = t.forward(torch.tensor([step.verdict.bonus]), cache, logits="last").logits[-1]
    kept = [int(x) for x in plain.tokens[step.verdict.path]] + [step.verdict.bonus]
    assert torch.allclose(nxt, causal_last_logits(t, prompt + kept), atol=ATOL)


class PrefillRowDrafter:
    """Asks for three side rows after the prompt and keeps the prefill output `begin` gets."""

    def __init__(self) -> None:
        self.prefilled = None

    def prefill_rows(self, prompt: torch.Tensor) -> SideRows:
        # rows at offsets 1, 2, 1 from the prompt's last token: a causal pair, then one alone
        mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
        return SideRows(torch.tensor([21, 22, 23]), torch.tensor([1, 2, 1]), mask)

    def begin(self, prompt, prefilled, root: int) -> None:
        self.prefilled = prefilled


def test_prefill_side_rows_reach_begin_and_leave_the_cache_to_the_prompt(device_target):
    t = device_target
    prompt = random_prompt(t, 12, seed=6)
    cfg = GenerationConfig(max_new_tokens=8)
    plain_cache, plain, plain_root = prefill(t, prompt, cfg, None)
    drafter = PrefillRowDrafter()
    cache, out, root = prefill(t, prompt, cfg, None, drafter)
    assert root == plain_root and cache.length == len(prompt)
    assert out.logits.shape == (1, t.vocab_size) and out.hidden.shape[0] == len(prompt)
    assert torch.allclose(out.logits[-1], plain.logits[-1], atol=ATOL)
    side = drafter.prefilled.side_logits
    for row, extra in ((0, [21]), (1, [21, 22]), (2, [23])):
        assert torch.allclose(side[row], causal_last_logits(t, prompt + extra), atol=ATOL), f"side row {row}"
    a = t.forward(torch.tensor([root]), cache, logits="last").logits[-1]
    b = t.forward(torch.tensor([root]), plain_cache, logits="last").logits[-1]
    assert torch.allclose(a, b, atol=ATOL)


def test_side_rows_must_fit_the_tree():
    rows = SideRows(torch.tensor([1, 2]), torch.tensor([1, 2]), torch.ones(2, 4, dtype=torch.bool))
    tree = DraftTree(torch.tensor([5, 6]), torch.tensor([-1, 0]), side=rows)  # root, 1 node, 2 side rows
    assert tree.width == 4 and tree.size == 1
    try:
        DraftTree(torch.tensor([5]), torch.tensor([-1]), side=rows)
    except ValueError:
        pass
    else:
        raise AssertionError("a side mask of the wrong width must be refused")


def test_trie_merges_prefixes_and_keeps_to_depth_and_budget():
    tree = trie_tree(9, [[1, 2, 3], [1, 2, 4], [5], [1, 6]], max_depth=2)
    assert tree.tokens.tolist() == [9, 1, 2, 5, 6] and tree.parent_list == [-1, 0, 1, 0, 1]
    cut = trie_tree(9, [[1, 2, 3], [5, 6]], max_depth=3, max_nodes=4)
    assert cut.tokens.tolist() == [9, 1, 2, 3, 5] and cut.parent_list == [-1, 0, 1, 2, 0]
    assert trie_tree(9, [[1, 2]], max_depth=0).size == 0
