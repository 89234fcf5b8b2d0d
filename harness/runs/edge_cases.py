"""The edge cases of `cli.py check-method`: answers at the borders of what the loop hands a drafter,
each decoded greedily through begin / propose / observe beside AR on the same prompt.

  one-token prompt       the prompt is a single token
  few-token prompt       three tokens
  context limit          the answer runs into the target's context: the room shrinks to 1 and the
                         answer stops ("context"). On a target whose context is longer than
                         REAL_CONTEXT_MAX tokens the loop is told a limit just past the prompt
                         instead (an 8k-token prefill would cost minutes on a CPU), so a drafter's
                         own tables at the model's real last positions are not reached there.
  EOS at once            the first new token is an EOS (the target's EOS set is made that token for
                         the answer): `begin`, and no `propose`
  EOS in the first step  the second new token is an EOS: one `propose`, no `observe` of it
  token limit 1 / 2      `begin` alone; one `propose` with room for one token (the root alone)
Any exception is a failure naming the case; so is an answer other than AR's. The trees go to the
tree contract (the room rule above all). The cases follow one another on the same drafter, so a
sequence that ended without `observe` is followed by a `begin`.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from harness.core.decode import GenerationConfig, generate
from harness.core.target import Target

REAL_CONTEXT_MAX = 1024   # longer contexts: the limit is simulated just past the prompt
CONTEXT_MARGIN = 8        # the context-limit prompt ends this many tokens before the limit
MAX_NEW = 8               # tokens per edge-case answer


@dataclass
class EdgeCase:
    name: str
    prompt: list[int]
    max_new_tokens: int = MAX_NEW
    setting: Callable[[], object] | None = None  # a context manager to decode under


@contextmanager
def eos_is(target: Target, token: int) -> Iterator[None]:
    """The target's EOS set is {token} for the block."""
    saved = target.eos_token_ids
    target.eos_token_ids = {token}
    try:
        yield
    finally:
        target.eos_token_ids = saved


@contextmanager
def context_limit_at(target: Target, limit: int) -> Iterator[None]:
    """The loop reads the target's context length as `limit` for the block (the model is untouched)."""
    saved = target.config
    target.config = copy.copy(saved)
    target.config.max_position_embeddings = limit
    try:
        yield
    finally:
        target.config = saved


def edge_cases(target: Target, base: list[int], ar_first: list[int]) -> list[EdgeCase]:
    """The cases, built from a prompt of the card (`base`) and AR's first two greedy tokens on it."""
    max_ctx = getattr(target.config, "max_position_embeddings", 1 << 30)
    if max_ctx <= REAL_CONTEXT_MAX:
        limit, how = max_ctx, "the target's own"
    else:
        limit, how = len(base) + CONTEXT_MARGIN, "set just past the prompt"
    long = (base * (limit // max(1, len(base)) + 1))[: limit - CONTEXT_MARGIN]
    cases = [
        EdgeCase("one-token prompt", base[:1]),
        EdgeCase("few-token prompt", base[:3]),
        EdgeCase(f"context limit ({how}: {limit} tokens)", long, 2 * CONTEXT_MARGIN,
                 None if how.startswith("the target") else (lambda: context_limit_at(target, limit))),
        EdgeCase("EOS at once", base, MAX_NEW, lambda: eos_is(target, ar_first[0])),
        EdgeCase("token limit 1", base, 1),
        EdgeCase("token limit 2", base, 2),
    ]
    if len(ar_first) > 1 and ar_first[1] != ar_first[0]:
        cases.insert(4, EdgeCase("EOS in the first step", base, MAX_NEW, lambda: eos_is(target, ar_first[1])))
    return cases


def run_case(target: Target, drafter, case: EdgeCase, budget: int | None) -> str:
    """"" when the drafter's answer is AR's, else what went wrong."""
    with case.setting() if case.setting else nullcontext():
        ar = generate(target, case.prompt, GenerationConfig(case.max_new_tokens))
        try:
            sp = generate(target, case.prompt, GenerationConfig(case.max_new_tokens, tree_budget=budget), drafter)
        except Exception as e:  # noqa: BLE001 - a drafter's crash is the finding
            return f"{type(e).__name__}: {e}"
    if sp.output_ids != ar.output_ids:
        return f"the answer differs from AR's ({sp.output_ids[:6]} vs {ar.output_ids[:6]})"
    return ""
