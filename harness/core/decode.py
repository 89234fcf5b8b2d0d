"""The decoding loop shared by every method: prefill -> propose -> verify -> accept -> commit.

Plain autoregressive decoding is the same loop with an empty draft (the tree is the root alone),
so AR and every drafter run on the same Target, cache and acceptance code.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.core.tree import DraftTree
from harness.core.verify import Sampling, Verdict, greedy_tokens, processed_probs, sample, verify


@dataclass
class DraftContext:
    """What a drafter may look at when proposing: the committed tokens (prompt + output so far,
    the root last; the root's KV is not cached yet), the sampling settings and the RNG."""

    tokens: list[int]
    root: int
    sampling: Sampling
    generator: torch.Generator | None
    max_nodes: int  # remaining room: never propose deeper than this many new tokens

    @property
    def position(self) -> int:
        """Absolute position of the root."""
        return len(self.tokens) - 1


@dataclass
class Acceptance:
    """What the drafter sees after a verify step."""

    tree: DraftTree
    path: list[int]            # accepted node indices, root first
    tokens: torch.Tensor       # [A+1] tokens of the path (root first)
    hidden: torch.Tensor       # [A+1, H] target features (last layer, normed) at those nodes
    bonus: int                 # the target's next token (the next root)
    logits: torch.Tensor | None = None  # [A+1, V] target logits on the path (Medusa-style heads)

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: Sampling = field(default_factory=Sampling)
    stop_strings: tuple[str, ...] = ()
    seed: int = 0
    record_logit_gaps: bool = False  # AR greedy: keep top-1 logit and top-2 gap per position

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SpecbenchError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    output_ids: list[int]
    prompt_tokens: int
    prefill_s: float
    wall_s: float
    stop_reason: str
    tree_size: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    top1: list[float] | None = None
    gap: list[float] | None = None

    @property
    def steps(self) -> dict[str, list]:
        return {"tree_size": self.tree_size, "accepted": self.accepted, "tokens": self.tokens,
                "draft_ms": [round(x, 3) for x in self.draft_ms],
                "verify_ms": [round(x, 3) for x in self.verify_ms]}

    @property
    def tau(self) -> float:
        return sum(self.tokens) / max(1, len(self.tokens))


def _pick(logits_row: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    if sampling.temperature == 0:
        return int(greedy_tokens(logits_row))
    return sample(processed_probs(logits_row, sampling.temperature, sampling.top_p), generator)


def _top2(logits_rows: torch.Tensor) -> tuple[list[float], list[float]]:
    v = logits_rows.float().topk(2, dim=-1).values
    return v[:, 0].tolist(), (v[:, 0] - v[:, 1]).tolist()


def _stop_at(target: Target, out: list[int], n_new: int, stop_strings: tuple[str, ...]) -> int | None:
    """Length to cut `out` to if a stop string appeared among the last n_new tokens, else None."""
    tail_start = max(0, len(out) - n_new - 16)
    if not any(s in target.decode(out[tail_start:]) for s in stop_strings):
        return None
    for n in range(max(1, len(out) - n_new), len(out) + 1):
        if any(s in target.decode(out[tail_start:n]) for s in stop_strings):
            return n
    return None


@torch.inference_mode()
def generate(target: Target, prompt_ids: list[int], cfg: GenerationConfig, drafter=None) -> Generation:
    """Generate up to cfg.max_new_tokens after `prompt_ids`, with `drafter` or autoregressively."""
    if not prompt_ids:
        raise SpecbenchError("empty prompt: nothing to condition on")
    sampling = cfg.sampling
    gen = torch.Generator().manual_seed(cfg.seed) if sampling.temperature > 0 else None
    max_ctx = getattr(target.config, "max_position_embeddings", 1 << 30)
    if len(prompt_ids) + 1 >= max_ctx:
        raise SpecbenchError(f"prompt of {len(prompt_ids)} tokens does not fit the target's context ({max_ctx})")
    t0 = time.perf_counter()

    # 1. Prefill: the prompt goes into the cache; its last logits give the first new token (the root).
    cache = target.new_cache(capacity=len(prompt_ids) + cfg.max_new_tokens + 80)
    prompt = torch.tensor(prompt_ids)
    pre = target.forward(prompt, cache, logits="last")
    root = _pick(pre.logits[-1], sampling, gen)
    res = Generation([root], len(prompt_ids), 0.0, 0.0, "length")
    if cfg.record_logit_gaps:
        res.top1, res.gap = _top2(pre.logits[-1:])
    if drafter is not None:
        drafter.begin(prompt, pre, root)
    res.prefill_s = time.perf_counter() - t0
    context = list(prompt_ids) + [root]
    eos = target.eos_token_ids
    if root in eos:
        res.stop_reason = "eos"

    while res.stop_reason != "eos" and len(res.output_ids) < cfg.max_new_tokens:
        start = cache.length
        room = min(cfg.max_new_tokens - len(res.output_ids), max_ctx - start - 2)
        if room < 1:
            res.stop_reason = "context"
            break
        # 2. Propose a tree under the root.
        td = time.perf_counter()
        if drafter is None:
            tree = DraftTree.root_only(root)
        else:
            tree = drafter.propose(DraftContext(context, root, sampling, gen, room))
        t1 = time.perf_counter()
        # 3. One target forward over root + tree nodes, on top of the cached prefix.
        if tree.size == 0:
            out = target.forward(tree.tokens, cache)
        else:
            out = target.forward(tree.tokens, cache, position_ids=start + tree.depths,
                                 tree_mask=tree.attention_mask)
        # 4. Accept a path; the rest of the tree's cache rows are dropped.
        verdict: Verdict = verify(tree, out.logits, sampling, gen)
        path = verdict.path
        if tree.size:
            cache.commit(start, torch.tensor(path))
        t2 = time.perf_counter()
        new = tree.tokens[path[1:]].tolist() + [verdict.bonus]
        if cfg.record_logit_gaps:
            t1s, gs = _top2(out.logits[path])
            res.top1 += t1s
            res.gap += gs
        # Trim at EOS, a stop string, or the token limit.
        for i, t in enumerate(new):
            if t in eos:
                new = new[: i + 1]
                res.stop_reason = "eos"
                break
        new = new[: cfg.max_new_tokens - len(res.output_ids)]
        res.output_ids += new
        if cfg.stop_strings:
            cut = _stop_at(target, res.output_ids, len(new), cfg.stop_strings)
            if cut is not None:
                new = new[: len(new) - (len(res.output_ids) - cut)]
                res.output_ids = res.output_ids[:cut]
                res.stop_reason = "stop"
        context += new
        # 5. The drafter consumes the accepted tokens and their target features.
        td2 = time.perf_counter()
        if drafter is not None and res.stop_reason not in ("eos", "stop"):
            drafter.observe(Acceptance(tree, path, tree.tokens[path], out.hidden[path], verdict.bonus,
                                       out.logits[path]))
        t3 = time.perf_counter()
        root = verdict.bonus
        res.tree_size.append(tree.size)
        res.accepted.append(verdict.accepted)
        res.tokens.append(len(new))
        res.draft_ms.append(((t1 - td) + (t3 - td2)) * 1e3)
        res.verify_ms.append((t2 - t1) * 1e3)
        if res.stop_reason == "stop":
            break
    if cfg.record_logit_gaps:
        res.top1 = res.top1[: len(res.output_ids)]
        res.gap = res.gap[: len(res.output_ids)]
    res.wall_s = time.perf_counter() - t0
    return res
