"""The record of one answer, and the trace that fills it around the decoding loop.

The loop (harness/core/decode.py) runs the algorithm; everything it measures is done here, by a
`GenerationTrace` the loop creates: it starts the clock, reads the prefill's seconds, lends each
step a `PhaseTimer` (harness/core/timing.py) and files the step's phase seconds and sizes, and
when asked (AR greedy) keeps the top-1 logit and its gap to the top-2 at every committed position,
which tells a greedy mismatch at a near tie from a real one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from harness.core.target import TargetOutput
from harness.core.timing import Clock, PhaseTimer

if TYPE_CHECKING:
    from harness.core.decode import Step


@dataclass
class Generation:
    """One answer: its tokens, why it stopped, its clock, and one entry per step in each step list."""

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

    def add_step(self, step: Step) -> None:
        self.tree_size.append(step.tree.size)
        self.accepted.append(step.verdict.accepted)
        self.tokens.append(len(step.kept))
        self.draft_ms.append(step.draft_s * 1e3)
        self.verify_ms.append(step.verify_s * 1e3)


def top1_and_gap(logits_rows: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per row of `logits_rows` [R, V]: the top-1 logit and its gap to the top-2 (how close AR
    greedy was to a tie)."""
    v = logits_rows.float().topk(2, dim=-1).values
    return v[:, 0].tolist(), (v[:, 0] - v[:, 1]).tolist()


class GenerationTrace:
    """Fills a `Generation` around the loop: created just before the prefill (the wall clock starts),
    told of the prefill and of each step, and asked for the record at the end."""

    def __init__(self, clock: Clock, prompt_tokens: int, logit_gaps: bool) -> None:
        self.clock = clock
        self.phases = PhaseTimer(clock)  # the hook each step marks its phases with
        self.res = Generation([], prompt_tokens, prefill_s=0.0, wall_s=0.0, stop_reason="",
                              top1=[] if logit_gaps else None, gap=[] if logit_gaps else None)
        self.started = clock.now()

    def prefilled(self, out: TargetOutput) -> None:
        """The prefill is done: the root's logit gap ([1, V] last logits row), then its seconds."""
        self._logit_gaps(out.logits[-1:])
        self.res.prefill_s = self.clock.now() - self.started

    def add(self, step: Step) -> None:
        """File one step: its phase seconds, also set on `step` (drafting = propose + observe;
        verifying = the target forward, the acceptance rule and the cache commit), its sizes, and
        the logit gaps of its accepted path's rows ([A+1, V])."""
        seconds = self.phases.take()
        step.draft_s, step.verify_s = seconds["propose"] + seconds["observe"], seconds["verify"]
        self._logit_gaps(step.verified.logits[step.verdict.path])
        self.res.add_step(step)

    def finish(self, output_ids: list[int], stop_reason: str) -> Generation:
        """The record: the answer's tokens, the gaps cut to them (a trimmed step recorded more), the wall clock."""
        res = self.res
        res.output_ids, res.stop_reason = output_ids, stop_reason
        if res.top1 is not None and res.gap is not None:
            res.top1, res.gap = res.top1[: len(output_ids)], res.gap[: len(output_ids)]
        res.wall_s = self.clock.now() - self.started
        return res

    def _logit_gaps(self, logits_rows: torch.Tensor) -> None:
        if self.res.top1 is not None and self.res.gap is not None:
            top1, gap = top1_and_gap(logits_rows)
            self.res.top1 += top1
            self.res.gap += gap
