"""The decoding loop shared by every method: prefill -> propose -> verify -> accept -> commit.

Plain autoregressive decoding is the same loop with an empty draft (the tree is the root alone),
so AR and every drafter run on the same Target, cache and acceptance code. As in gpt-fast's
`generate.py`, the loop is a few small functions: `prefill`, `speculative_step` (one step: the
algorithm alone), `Answer.extend` (trimming at EOS, a stop string or the token limit) and
`generate`, which strings them together. What is measured is measured around them: `generate`
hands the step a `PhaseTimer` hook to mark its phases with, and a `GenerationTrace`
(harness/core/generation.py) files the clocks, the per-step records and the logit gaps.

On a GPU the loop keeps the target's tensors on its device. Per step it copies to the device the
tree's tokens, position ids and mask (`DraftTree.verify_inputs`) and the accepted path's row
indices, and reads back only what the acceptance rule must read (harness/core/verify.py: the
[N+1] argmax ids under greedy, one [V] distribution per accepted depth when sampling), plus the
top-1 logit and gap of the path's rows when AR records them. Every clock is a `Clock` on the
target's devices (harness/core/timing.py), which waits for queued kernels before it reads.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from harness.core.errors import SpecbenchError
from harness.core.generation import Generation, GenerationTrace
from harness.core.kvcache import KVCache
from harness.core.packed_linear import weight_format
from harness.core.target import Target, TargetOutput
from harness.core.timing import Clock, Phase, untimed
from harness.core.tree import DraftTree
from harness.core.verify import Sampling, Verdict, greedy_tokens, processed_probs, sample, verify

# Stop reasons after which the drafter is not told about the step: the sequence is over.
FINISHED = ("eos", "stop")


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
    layers: dict[int, torch.Tensor] | None = None  # {i: [A+1, H]} inputs of the layers the drafter asks for

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


# ----------------------------------------------------------------------------- small pieces

def pick_token(logits_row: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The target's next token from one logits row: argmax at T = 0, else a sample."""
    if sampling.temperature == 0:
        return int(greedy_tokens(logits_row))
    return sample(processed_probs(logits_row, sampling.temperature, sampling.top_p), generator)


def stop_string_cut(target: Target, out: list[int], n_new: int, stop_strings: tuple[str, ...]) -> int | None:
    """Length to cut `out` to if a stop string appeared among the last n_new tokens, else None."""
    tail_start = max(0, len(out) - n_new - 16)
    if not any(s in target.decode(out[tail_start:]) for s in stop_strings):
        return None
    for n in range(max(1, len(out) - n_new), len(out) + 1):
        if any(s in target.decode(out[tail_start:n]) for s in stop_strings):
            return n
    return None


# ----------------------------------------------------------------------------- the answer so far

@dataclass
class Answer:
    """The tokens generated so far, trimmed, and the context drafters see (prompt + answer)."""

    target: Target
    cfg: GenerationConfig
    eos: Collection[int]
    ids: list[int]
    context: list[int]      # one list for the whole answer: extended in place, never replaced
    stop_reason: str = "length"

    @classmethod
    def begin(cls, target: Target, cfg: GenerationConfig, prompt_ids: list[int], root: int) -> Answer:
        """The answer after the prefill: the root alone, already finished if the root is an EOS."""
        answer = cls(target, cfg, target.eos_token_ids, [root], list(prompt_ids) + [root])
        if root in answer.eos:
            answer.stop_reason = "eos"
        return answer

    @property
    def finished(self) -> bool:
        """EOS or a stop string: no further step, and the drafter is not told about the last one."""
        return self.stop_reason in FINISHED

    @property
    def room(self) -> int:
        return self.cfg.max_new_tokens - len(self.ids)

    def extend(self, new: list[int]) -> list[int]:
        """Add a step's tokens (accepted drafts + bonus), cut at the first EOS, at the token
        limit, and at the end of a stop string (which outranks EOS); return the tokens kept."""
        for i, t in enumerate(new):
            if t in self.eos:
                new = new[: i + 1]
                self.stop_reason = "eos"
                break
        new = new[: self.room]
        self.ids += new
        if self.cfg.stop_strings:
            cut = stop_string_cut(self.target, self.ids, len(new), self.cfg.stop_strings)
            if cut is not None:
                new = new[: len(new) - (len(self.ids) - cut)]
                self.ids = self.ids[:cut]
                self.stop_reason = "stop"
        self.context += new
        return new


# ----------------------------------------------------------------------------- the loop's steps

def drafting_weights(drafter) -> weight_format:
    """The drafter's calls run on the weight format it asks for (its `weights` setting: "native" or
    "int8"); the target's forward, outside this, never does."""
    return weight_format(getattr(drafter, "config", {}).get("weights"))


def feature_layers(drafter) -> list[int] | None:
    """The target layers whose inputs the drafter reads beside the last hidden state, at prefill
    and at every verify (its `target_layers()`: EAGLE-3's low, middle and high layer); None when
    it reads none, or there is no drafter."""
    layers = getattr(drafter, "target_layers", None)
    return (layers() or None) if layers is not None else None


def prefill(target: Target, prompt_ids: list[int], cfg: GenerationConfig, generator: torch.Generator | None,
            drafter=None) -> tuple[KVCache, TargetOutput, int]:
    """1. The prompt goes into a new cache; its last logits give the first new token (the root),
    and the drafter starts a sequence on the prompt's features. Returns (cache, prefill output, root)."""
    cache = target.new_cache(capacity=len(prompt_ids) + cfg.max_new_tokens + 80)
    prompt = torch.tensor(prompt_ids)
    prefilled = target.forward(prompt, cache, logits="last", layers=feature_layers(drafter))
    root = pick_token(prefilled.logits[-1], cfg.sampling, generator)
    if drafter is not None:
        with drafting_weights(drafter):
            drafter.begin(prompt, prefilled, root)
    return cache, prefilled, root


def verify_tree(target: Target, cache: KVCache, tree: DraftTree, sampling: Sampling,
                generator: torch.Generator | None, layers: list[int] | None = None) -> tuple[TargetOutput, Verdict]:
    """3-4. One target forward over root + tree nodes on top of the cached prefix; accept a path;
    keep only that path's cache rows. Returns the forward's output ([N+1] rows, with the inputs of
    `layers` too) and the verdict."""
    start = cache.length
    tokens, positions, mask = tree.verify_inputs(target.input_device, start)
    verified = target.forward(tokens, cache, position_ids=positions, tree_mask=mask if tree.size else None,
                              layers=layers)
    verdict = verify(tree, verified.logits, sampling, generator)
    if tree.size:
        cache.commit(start, torch.tensor(verdict.path, device=target.device))
    return verified, verdict


def propose(drafter, ctx: DraftContext) -> DraftTree:
    """2. The drafter's tree under `ctx.root`, or the root alone (plain AR) without a drafter."""
    if drafter is None:
        return DraftTree.root_only(ctx.root)
    with drafting_weights(drafter):
        return drafter.propose(ctx)


def observe(drafter, tree: DraftTree, verified: TargetOutput, verdict: Verdict) -> None:
    """5. The drafter sees the accepted path: its tokens [A+1] and, at its rows, the target's
    features [A+1, H], logits [A+1, V] and the inputs [A+1, H] of the layers it asked for."""
    path = verdict.path
    rows = torch.tensor(path, device=verified.hidden.device)
    with drafting_weights(drafter):
        layers = {i: h[rows.to(h.device)] for i, h in verified.layers.items()} if verified.layers else None
        drafter.observe(Acceptance(tree, path, tree.tokens[path], verified.hidden[rows], verdict.bonus,
                                   verified.logits[rows], layers))


@dataclass
class Step:
    """What one speculative step did, and its clock (filled by the loop's trace; 0.0 untimed)."""

    tree: DraftTree
    verified: TargetOutput  # logits [N+1, V] and hidden [N+1, H] of root + tree nodes
    verdict: Verdict
    kept: list[int]         # new tokens the answer kept (accepted drafts + bonus, after trimming)
    draft_s: float = 0.0    # propose + observe
    verify_s: float = 0.0   # target forward + verify + cache commit


def speculative_step(target: Target, cache: KVCache, drafter, answer: Answer, root: int,
                     sampling: Sampling, generator: torch.Generator | None, room: int,
                     phase: Phase = untimed) -> Step:
    """One step: 2. propose a tree under `root`; 3. verify it with one target forward; 4. accept
    a path and commit its cache rows, and trim the new tokens into `answer`; 5. let the drafter
    observe the accepted tokens and their target features (unless the answer is finished).
    `phase`: the hook that marks the timed phases (the loop's `PhaseTimer`; default: none)."""
    with phase("propose"):
        tree = propose(drafter, DraftContext(answer.context, root, sampling, generator, room))
    with phase("verify"):
        verified, verdict = verify_tree(target, cache, tree, sampling, generator, feature_layers(drafter))
    kept = answer.extend(tree.tokens[verdict.path[1:]].tolist() + [verdict.bonus])
    with phase("observe"):
        if drafter is not None and not answer.finished:
            observe(drafter, tree, verified, verdict)
    return Step(tree, verified, verdict, kept)


def context_limit(target: Target, prompt_ids: list[int]) -> int:
    """The target's context length, once the prompt is known to fit it with room for one token."""
    if not prompt_ids:
        raise SpecbenchError("empty prompt: nothing to condition on")
    max_ctx = getattr(target.config, "max_position_embeddings", 1 << 30)
    if len(prompt_ids) + 1 >= max_ctx:
        raise SpecbenchError(f"prompt of {len(prompt_ids)} tokens does not fit the target's context ({max_ctx})")
    return max_ctx


@torch.inference_mode()
def generate(target: Target, prompt_ids: list[int], cfg: GenerationConfig, drafter=None) -> Generation:
    """Generate up to cfg.max_new_tokens after `prompt_ids`, with `drafter` or autoregressively. The
    trace times the prefill, each step's phases and the whole, and keeps the logit gaps if cfg asks."""
    max_ctx = context_limit(target, prompt_ids)
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.sampling.temperature > 0 else None
    trace = GenerationTrace(Clock(target.devices), len(prompt_ids), cfg.record_logit_gaps)

    cache, prefilled, root = prefill(target, prompt_ids, cfg, generator, drafter)
    answer = Answer.begin(target, cfg, prompt_ids, root)
    trace.prefilled(prefilled)
    while not answer.finished and answer.room > 0:
        room = min(answer.room, max_ctx - cache.length - 2)
        if room < 1:
            answer.stop_reason = "context"
            break
        step = speculative_step(target, cache, drafter, answer, root, cfg.sampling, generator, room, trace.phases)
        trace.add(step)
        root = step.verdict.bonus
    return trace.finish(answer.ids, answer.stop_reason)
