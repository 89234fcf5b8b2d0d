"""The draft-vocabulary head: the target's frozen LM head, optionally over a draft vocabulary.

Draft vocabulary (EAGLE-3's idea): draft logits over the N most frequent answer tokens of the
training data only. On SmolLM2 8,192 of 49,152 ids cover 99.2% of distilled answer tokens, and
the 49k-column softmax is what dominates draft training and the draft's per-step cost on a CPU.
Verification still uses the full vocab, so greedy output is unchanged and sampling stays
lossless (q is simply zero outside the set).

A LearnedDrafter holds one `DraftVocabHead` as `vocab`. Its ids are saved under the drafter's own
key `draft_ids`, as every checkpoint written before the head was split out names them
(`flatten_vocab_key` / `nest_vocab_key`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from harness.core.errors import SpecbenchError
from harness.core.packed_linear import PackedLinear, tensors_key

UNREACHABLE = 1 << 30  # the rank of a token a drafter can never propose


class VocabRows(NamedTuple):
    """The LM-head rows of a draft vocabulary, derived once per set of ids."""

    weight: torch.Tensor          # [n, H]
    bias: torch.Tensor | None     # [n]
    to_draft: torch.Tensor        # [V] target id -> draft index, or -1
    linear: PackedLinear          # weight and bias, packed where that applies (drafting)


class DraftVocabHead(nn.Module):
    """Frozen-LM-head logits over `size` draft ids (0, or the whole vocab: no draft vocabulary).

    The ids are a buffer `draft_ids` [size] of sorted target token ids; placeholders until
    `set_draft_vocab` (training) or a checkpoint fills them.
    """

    def __init__(self, target, size: int) -> None:
        super().__init__()
        self.target = target
        ids = torch.arange(size, device=target.device) if 0 < size < target.vocab_size else None
        self.register_buffer("draft_ids", ids)
        self._cache: tuple | None = None

    @property
    def size(self) -> int:
        """Number of draft ids (0 = the full target vocab)."""
        return 0 if self.draft_ids is None else int(self.draft_ids.numel())

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """Use these target token ids (exactly `size` of them) as the draft vocabulary."""
        if ids.numel() != self.size:
            raise SpecbenchError(f"draft vocab needs {self.size} ids, got {ids.numel()}")
        self.draft_ids.copy_(ids.sort().values.to(self.draft_ids.device))

    def _rows(self) -> VocabRows:
        """The draft vocab's LM-head rows (`VocabRows`), cached until the ids change (a checkpoint
        load or `set_draft_vocab` bumps the buffer's version) or the head does."""
        head = self.target.lm_head
        key = tensors_key((self.draft_ids, head.weight, getattr(head, "bias", None)))
        if self._cache is None or self._cache[0] != key:
            ids = self.draft_ids
            bias = getattr(head, "bias", None)
            t2d = torch.full((self.target.vocab_size,), -1, dtype=torch.long, device=ids.device)
            t2d[ids] = torch.arange(ids.numel(), device=ids.device)
            w = head.weight.detach().index_select(0, ids)
            b = None if bias is None else bias.detach().index_select(0, ids)
            self._cache = (key, VocabRows(w, b, t2d, PackedLinear(w, b)))
        return self._cache[1]

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., n]: logits over the draft vocab (column j is target id draft_ids[j]),
        or [..., V] over the full vocab when there is no draft vocab."""
        h = hidden.to(self.target.dtype)
        if not self.size:
            return self.target.project(h)
        return self._rows().linear(h)  # packed once: a draft step projects a few rows per depth

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] logits over the full target vocab; ids outside the draft vocab get
        -inf, so top-k, softmax and sampling never pick them."""
        z = self.vocab_logits(hidden)
        if not self.size:
            return z
        out = z.new_full((*z.shape[:-1], self.target.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.draft_ids, z)

    def draft_topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([..., k] log-probs, [..., k] target token ids) of the k best draft tokens per row: the
        same values as `draft_logits(...).log_softmax(-1).topk(k)`, computed over the draft vocab
        only, so no full-vocab row is built, normalised or searched (the greedy tree drafters' hot path)."""
        top = self.vocab_logits(hidden).float().log_softmax(-1).topk(k)
        ids = self.draft_ids[top.indices] if self.size else top.indices
        return top.values, ids

    def vocab_ranks(self, hidden: torch.Tensor, labels: torch.Tensor, proj: nn.Module | None = None) -> torch.Tensor:
        """[...] rank of each label among the draft logits of `hidden` [..., H] (0 = the draft's
        top-1), through `proj` (a head's own vocab projection) or the frozen LM head over the draft
        vocab; a label the drafter cannot propose (outside the draft vocab) gets UNREACHABLE."""
        if proj is not None:
            z = proj(hidden).float()
        else:
            z = self.vocab_logits(hidden).float()
            if self.size:
                labels = self._rows().to_draft[labels]
        at = z.gather(-1, labels.clamp_min(0)[..., None])
        ranks = (z > at).sum(-1)
        return ranks.masked_fill(labels < 0, UNREACHABLE)

    def head_ce(self, pred: torch.Tensor, mask: torch.Tensor, *, target_hidden: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`frozen_head_ce` through the frozen LM head restricted to the draft vocab: soft targets
        are the target's distribution renormalised over it; a hard label outside it is masked."""
        from methods.common.losses import frozen_head_ce

        if not self.size:
            return frozen_head_ce(pred, self.target.lm_head.weight, mask, target_hidden=target_hidden, labels=labels)
        rows = self._rows()
        if labels is not None:
            labels = rows.to_draft[labels]
            mask = mask * (labels >= 0).to(mask.dtype)
        return frozen_head_ce(pred, rows.weight, mask, target_hidden=target_hidden, labels=labels)


# The drafter's attribute that holds its DraftVocabHead, and the key its ids are saved under.
HEAD_ATTR, IDS_KEY = "vocab", "draft_ids"


def flatten_vocab_key(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """state_dict post-hook: `vocab.draft_ids` -> `draft_ids`, in place and in the same position."""
    nested = f"{prefix}{HEAD_ATTR}.{IDS_KEY}"
    if nested in state:
        items = [(f"{prefix}{IDS_KEY}" if k == nested else k, v) for k, v in state.items()]
        state.clear()
        state.update(items)


def nest_vocab_key(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: `draft_ids` -> `vocab.draft_ids`, so saved files load as written."""
    flat = f"{prefix}{IDS_KEY}"
    if flat in state:
        state[f"{prefix}{HEAD_ATTR}.{IDS_KEY}"] = state.pop(flat)
