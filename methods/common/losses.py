"""The losses drafters compute in their `loss`: EAGLE's feature regression (`masked_smooth_l1`) and
cross-entropy through the target's frozen LM head (`frozen_head_ce`), chunked and exact, without
storing logits.

The 49k-vocab projection dominates draft training on a CPU. Autograd would keep every chunk's
[n, V] logits alive until backward (or recompute them under checkpointing). Because the head is
frozen, the gradient w.r.t. the draft's hidden state has a closed form,
    dL/dh = (softmax(h W^T) - p_target) W / count,
so each chunk computes its loss *and* that [n, H] gradient in the forward pass and keeps only the
gradient: three matmuls per chunk (teacher logits, draft logits, gradient), memory bounded by the
chunk, and nothing recomputed.
"""
from __future__ import annotations

import torch


# Elements of one chunk's logits: 16 MB in float32, under glibc's largest mmap threshold (32 MB).
CHUNK_ELEMENTS = 1 << 22


class _FrozenHeadCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pred, weight, target_hidden, labels, mask, chunk):
        # Only rows with mask set are projected (prompt and padding rows are a large share of a
        # batch). A chunk's [rows, V] float32 temporaries stay under glibc's 32 MB mmap threshold:
        # larger ones are mapped fresh and page-faulted on every allocation, which made each
        # elementwise pass over the logits 3-7x slower than the arithmetic (Sapphire Rapids).
        chunk = chunk or max(1, CHUNK_ELEMENTS // weight.shape[0])
        rows = mask.nonzero().squeeze(-1)
        weights = mask[rows].float()
        count = mask.sum().clamp_min(1.0)
        grad = torch.zeros_like(pred, dtype=torch.float32)
        total = pred.new_zeros((), dtype=torch.float32)
        correct = pred.new_zeros((), dtype=torch.float32)
        w = weight.detach()
        for s in range(0, rows.numel(), chunk):
            idx = rows[s : s + chunk]
            m = weights[s : s + chunk]
            logq = (pred[idx].detach().to(w.dtype) @ w.T).float().log_softmax(-1)
            hit = logq.max(-1).indices  # = argmax (first maximum), ~3x faster on CPU
            if labels is not None:
                t_arg = labels[idx]
                col = t_arg.clamp_min(0)[:, None]
                total -= (logq.gather(-1, col).squeeze(-1) * m).sum()
                g = logq.exp_().scatter_add_(-1, col, -torch.ones_like(m)[:, None])
            else:
                zt = (target_hidden[idx].to(w.dtype) @ w.T).float()
                t_arg = zt.max(-1).indices
                p = zt.softmax(-1)
                del zt
                total -= ((p * logq).sum(-1) * m).sum()
                g = logq.exp_().sub_(p)
            correct += ((hit == t_arg).float() * m).sum()
            grad[idx] = (g.to(w.dtype) @ w).float() * m[:, None]
        ctx.save_for_backward(grad / count)
        ctx.pred_dtype = pred.dtype
        return total / count, correct / count

    @staticmethod
    def backward(ctx, grad_loss, grad_acc):
        (grad,) = ctx.saved_tensors
        return (grad * grad_loss).to(ctx.pred_dtype), None, None, None, None, None


def frozen_head_ce(pred: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, *,
                   target_hidden: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                   chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean CE over rows where mask is set, of logits pred @ weight^T against either the soft
    targets softmax(target_hidden @ weight^T) (teacher distillation) or hard `labels`.

    pred: [N, H] (any leading dims are flattened); weight: [V, H] frozen; mask: [N].
    chunk: rows projected at once (default: CHUNK_ELEMENTS // V).
    Returns (loss, top-1 agreement with the teacher's argmax / the label), both scalars.
    """
    h = pred.shape[-1]
    pred = pred.reshape(-1, h)
    mask = mask.reshape(-1).float()
    if target_hidden is not None:
        target_hidden = target_hidden.reshape(-1, h).detach()
    if labels is not None:
        labels = labels.reshape(-1)
    return _FrozenHeadCE.apply(pred, weight, target_hidden, labels, mask, chunk)


def masked_smooth_l1(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Huber (beta 1) averaged over the hidden size, then over masked positions (EAGLE's V loss)."""
    per = torch.nn.functional.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1)
    m = mask.float()
    return (per * m).sum() / m.sum().clamp_min(1.0)
