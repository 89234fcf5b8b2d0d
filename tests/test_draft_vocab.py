"""The draft vocabulary: draft logits over the most frequent answer tokens only."""
from __future__ import annotations

import pytest
import torch

from harness.train.data import Sequence, frequent_answer_tokens
from methods.common.losses import frozen_head_ce
from methods.eagle import Eagle
from methods.eagle2 import Eagle2
from methods.medusa import Medusa
from tests.conftest import make_tiny_target
from tests.train_helpers import assert_greedy_exact, tiny_dataset, train_quickly


def test_frequent_answer_tokens_ranks_answers_then_prompts_then_ids():
    seqs = [Sequence(torch.tensor([7, 7, 7, 1, 1, 5, 5, 2]), torch.zeros(8, 4), prompt_len=3),
            Sequence(torch.tensor([2, 5, 2]), torch.zeros(3, 4), prompt_len=1)]
    # answers: 5 x3, 2 x2, 1 x2 (2 is also in a prompt, 1 is not), 7 only in prompts
    assert frequent_answer_tokens(seqs, 2, 10).tolist() == [2, 5]
    assert frequent_answer_tokens(seqs, 3, 10).tolist() == [1, 2, 5]
    assert frequent_answer_tokens(seqs, 4, 10).tolist() == [1, 2, 5, 7]
    assert frequent_answer_tokens(seqs, 5, 10).tolist() == [0, 1, 2, 5, 7]  # then the lowest unseen id


def test_inactive_when_it_would_cover_the_whole_vocab(tiny_target):
    assert Eagle(tiny_target, {"draft_vocab": 0}).draft_vocab_size == 0
    assert Eagle(tiny_target, {"draft_vocab": tiny_target.vocab_size}).draft_vocab_size == 0
    assert Medusa(tiny_target, {"draft_vocab": 8, "share_lm_head": False}).draft_vocab_size == 0
    assert Medusa(tiny_target, {"draft_vocab": 8}).draft_vocab_size == 8


def _gemm_error_bound(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on how far two float32 evaluations of `a @ w.T` may differ: each is within
    k·u·(|a| @ |w|.T) of the exact product (the standard dot-product error bound, u = 2^-24), and
    GEMMs over different column slices or row counts pick different kernels and summation orders
    on different CPUs (AMX, AVX-512, AVX2), so only that bound is promised, not bit equality."""
    k, u = a.shape[-1], torch.finfo(torch.float32).eps / 2
    return 2 * k * u * (a.abs() @ w.abs().T)


def test_logits_and_loss_are_restricted(tiny_target):
    gen = torch.Generator().manual_seed(5)
    d = Eagle(tiny_target, {"draft_vocab": 10})
    ids = torch.tensor([3, 90, 11, 40, 2, 77, 5, 60, 61, 9])
    d.set_draft_vocab(ids)
    h = torch.randn(4, tiny_target.hidden_size, generator=gen)
    z = d.vocab.draft_logits(h)
    full = tiny_target.project(h)
    inside = torch.zeros(tiny_target.vocab_size, dtype=torch.bool)
    inside[ids] = True
    # Exactly the draft ids are finite; their logits are the LM head's up to float32 rounding.
    assert bool(torch.isneginf(z[:, ~inside]).all()) and bool(torch.isfinite(z[:, inside]).all())
    w_in = tiny_target.lm_head.weight[inside]
    assert bool(((z[:, inside] - full[:, inside]).abs() <= _gemm_error_bound(h, w_in)).all())
    # Soft targets: the teacher renormalised over the draft vocab.
    teacher = torch.randn(4, tiny_target.hidden_size, generator=gen)
    mask = torch.ones(4)
    loss, _ = d.vocab.head_ce(h, mask, target_hidden=teacher)
    w = tiny_target.lm_head.weight[ids.sort().values]
    p = (teacher @ w.T).softmax(-1)
    ref = -(p * (h @ w.T).log_softmax(-1)).sum(-1).mean()
    # Logits of magnitude ~10 (the head is scaled by 8) carry ~1e-6 of rounding; a cross-entropy
    # over 10 classes moves by at most about that, so 1e-5 relative is a safe margin.
    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)
    # Hard labels outside the draft vocab are masked, the others map to draft indices.
    labels = torch.tensor([3, 4, 90, 6])
    loss, _ = d.vocab.head_ce(h, mask, labels=labels)
    ref, _ = frozen_head_ce(h[[0, 2]], w, torch.ones(2), labels=torch.tensor([1, 9]))  # sorted ids: 3 is index 1
    # The same rows through GEMMs of 4 vs 2 rows: another kernel, the same bound as above.
    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)


def test_ids_survive_a_bf16_checkpoint_exactly(tmp_path):
    target = make_tiny_target(vocab=700)  # ids above 256 are not representable in bf16
    d = Eagle(target, {"draft_vocab": 50})
    ids = torch.arange(301, 701, 8)[:50]
    d.set_draft_vocab(ids)
    d.save_pretrained(tmp_path)
    # The head's ids keep the key every committed checkpoint uses: `draft_ids`, not `vocab.draft_ids`.
    from safetensors.torch import load_file

    assert "draft_ids" in load_file(str(tmp_path / "model.safetensors")) and "draft_ids" in d.state_dict()
    loaded = Eagle.from_pretrained(tmp_path, target)
    assert torch.equal(loaded.vocab.draft_ids, ids)
    h = torch.randn(2, target.hidden_size, generator=torch.Generator().manual_seed(6))
    assert bool(torch.isneginf(loaded.vocab.draft_logits(h)[:, :301]).all())


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Eagle, Eagle2])
def test_greedy_stays_exact_with_a_draft_vocab(tiny_target, tmp_path, cls):
    data = tiny_dataset(tiny_target)
    d = Eagle(tiny_target, {"draft_vocab": 48})
    d.set_draft_vocab(frequent_answer_tokens(data.train, 48, tiny_target.vocab_size))
    train_quickly(d, data, tmp_path)
    d.save_pretrained(tmp_path / "ckpt")
    drafter = cls.from_pretrained(tmp_path / "ckpt", tiny_target)
    assert drafter.draft_vocab_size == 48
    assert_greedy_exact(tiny_target, drafter, seed=21)
