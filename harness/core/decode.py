"""The decoding loop shared by every method: prefill -> propose -> verify -> accept -> commit.

Plain autoregressive decoding is the same loop with an empty draft (the tree is the root alone),
so AR and every drafter run on the same Target, cache and acceptance code. As in gpt-fast's
`generate.py`, the loop is a few small functions: `prefill`, `speculative_step` (one step: the
algorithm alone), `Answer.extend` (trimming at EOS, a stop string or the token limit) and
`generate`, which strings them together. What is measured is measured around them: `generate`
hands the step a `PhaseTimer` hook to mark its phases with, and a `GenerationTrace` (below) files
the clocks, the per-step records and the logit gaps into the answer's `Generation`.

On a GPU the loop keeps the target's tensors on its device. Per step it copies to the device the
tree's tokens, position ids and mask (`DraftTree.verify_inputs`) and the accepted path's row
indices, and reads back only what the acceptance rule must read (harness/core/verify.py: the
[N+1] argmax ids under greedy, one [V] distribution per accepted depth when sampling), plus the
top-1 logit and gap of the path's rows when AR records them. Every clock is a `Clock` on the
target's devices (harness/core/timing.py), which waits for queued kernels before it reads.

Side rows (harness/core/tree.py: `SideRows`, Lookahead's Jacobi window) ride in the same forwards:
a tree may carry them, and a drafter may ask for some after the prompt in the prefill's forward
(`prefill_rows`). The loop splits their logits off the forward's output (`split_side_rows`), so the
acceptance rule, the trace and the cache commit see the tree's rows only, and hands them to the
drafter (`begin`'s prefill output and `Acceptance.side_logits`); their cache rows are never kept.
A tree without side rows, and AR, run exactly as before.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from harness.core.errors import SpecbenchError
from harness.core.kvcache import KVCache
from harness.core.packed_linear import weight_format
from harness.core.target import Target, TargetOutput
from harness.core.timing import Clock, Phase, PhaseTimer, untimed
from harness.core.tree import DraftTree, SideRows
from harness.core.verify import Sampling, Verdict, greedy_tokens, processed_probs, sample, verify

# Stop reasons after which the drafter is not told about the step: the sequence is over.
FINISHED = ("eos", "stop")


@dataclass
class DraftContext:
    """What a drafter may look at when proposing: the committed tokens (prompt + output so far,
    the root last; the root's KV is not cached yet), the sampling settings and the RNG, and the
    two limits of its tree: the room (depth) and, when set, the budget (size)."""

    tokens: list[int]
    root: int
    sampling: Sampling
    generator: torch.Generator | None
    max_nodes: int  # remaining room: never propose deeper than this many new tokens
    # Most draft nodes the tree may hold; None: as the drafter's config sizes it. Runs size trees by
    # config (`budget_overrides`); `cli.py check-method` always sets one and holds every drafter to it.
    budget: int | None = None

    def within_budget(self, nodes: int) -> int:
        """`nodes` draft nodes, cut to the budget when one is set."""
        return nodes if self.budget is None else min(nodes, self.budget)

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
    side_logits: torch.Tensor | None = None  # [S, V] target logits at the tree's side rows, if it had any
    tree_logits: torch.Tensor | None = None  # [N+1, V] target logits at every tree node (Token Recycling)

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
    tree_budget: int | None = None   # DraftContext.budget of every proposal (None in runs)

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


def prefill_side_rows(drafter, prompt: torch.Tensor) -> SideRows | None:
    """The side rows the drafter asks to run after the prompt in the prefill's forward (its
    `prefill_rows`), or None."""
    rows = getattr(drafter, "prefill_rows", None)
    return rows(prompt) if rows is not None else None


def first_rows(layers: dict[int, torch.Tensor] | None, n: int) -> dict[int, torch.Tensor] | None:
    """The first n rows of each captured layer input ({i: [n, H]})."""
    return {i: h[:n] for i, h in layers.items()} if layers else layers


def split_side_rows(out: TargetOutput, n: int) -> TargetOutput:
    """The forward's output [n+S, ...] as the first n rows', with the last S rows' logits as
    `side_logits` [S, V]."""
    return TargetOutput(out.logits[:n], out.hidden[:n], first_rows(out.layers, n), out.logits[n:])


def prefill_with_side_rows(target: Target, cache: KVCache, prompt: torch.Tensor, side: SideRows,
                           layers: list[int] | None) -> TargetOutput:
    """The prefill's forward over the prompt [P] and then the side rows [S] (the prompt causal, the
    side rows after it as their mask [S, 1+S] says, positions from the prompt's last); the cache
    keeps the prompt's rows only. Returns the prompt's output (logits of its last row) with the
    side rows' logits."""
    n = prompt.numel()
    mask = torch.ones(n + side.size, n + side.size, dtype=torch.bool).tril()
    mask[n:, n - 1:] = side.mask
    positions = torch.cat((torch.arange(n), n - 1 + side.offsets))
    out = target.forward(torch.cat((prompt, side.tokens)), cache, position_ids=positions, tree_mask=mask,
                         logits="none", layers=layers)
    cache.crop_to(n)
    logits = target.project(out.hidden[n - 1:])  # [1+S, V]: the prompt's last row, then the side rows
    return TargetOutput(logits[:1], out.hidden[:n], first_rows(out.layers, n), logits[1:])


def prefill_forward(target: Target, cache: KVCache, prompt: torch.Tensor, drafter=None) -> TargetOutput:
    """The prefill's forward of `prompt` [P] into the empty `cache`: the logits of its last row, the
    features and layer inputs `drafter` reads, and the logits of any side rows it asks to run after
    the prompt (what its `begin` is given)."""
    side = prefill_side_rows(drafter, prompt)
    if side is None:
        return target.forward(prompt, cache, logits="last", layers=feature_layers(drafter))
    return prefill_with_side_rows(target, cache, prompt, side, feature_layers(drafter))


def prefill(target: Target, prompt_ids: list[int], cfg: GenerationConfig, generator: torch.Generator | None,
            drafter=None) -> tuple[KVCache, TargetOutput, int]:
    """1. The prompt goes into a new cache; its last logits give the first new token (the root),
    and the drafter starts a sequence on the prompt's features (and on the logits of the side rows
    it asked to run after the prompt). Returns (cache, prefill output, root)."""
    cache = target.new_cache(capacity=len(prompt_ids) + cfg.max_new_tokens + 80)
    prompt = torch.tensor(prompt_ids)
    prefilled = prefill_forward(target, cache, prompt, drafter)
    root = pick_token(prefilled.logits[-1], cfg.sampling, generator)
    if drafter is not None:
        with drafting_weights(drafter):
            drafter.begin(prompt, prefilled, root)
    return cache, prefilled, root


def observe(drafter, tree: DraftTree, verified: TargetOutput, verdict: Verdict) -> None:
    """5. The drafter sees the accepted path: its tokens [A+1] and, at its rows, the target's
    features [A+1, H], logits [A+1, V] and the inputs [A+1, H] of the layers it asked for; and the
    logits of every verified node [N+1, V], rejected ones included (no copy: the verify's own)."""
    path = verdict.path
    rows = torch.tensor(path, device=verified.hidden.device)
    with drafting_weights(drafter):
        layers = {i: h[rows.to(h.device)] for i, h in verified.layers.items()} if verified.layers else None
        drafter.observe(Acceptance(tree, path, tree.tokens[path], verified.hidden[rows], verdict.bonus,
                                   verified.logits[rows], layers, side_logits=verified.side_logits,
                                   tree_logits=verified.logits))


@dataclass
class Step:
    """What one speculative step did, and its clock (filled by the loop's trace; 0.0 untimed)."""

    tree: DraftTree
    verified: TargetOutput  # logits [N+1, V] and hidden [N+1, H] of root + tree nodes (+ side_logits [S, V])
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
        if drafter is None:
            tree = DraftTree.root_only(root)   # plain AR: the root alone
        else:
            with drafting_weights(drafter):
                tree = drafter.propose(DraftContext(answer.context, root, sampling, generator, room,
                                                    answer.cfg.tree_budget))
    with phase("verify"):
        # One target forward over root + tree (+ side rows) on top of the cached prefix; the
        # acceptance rule picks a path, and only that path's cache rows are kept.
        start = cache.length
        tokens, positions, mask = tree.verify_inputs(target.input_device, start)
        verified = target.forward(tokens, cache, position_ids=positions, tree_mask=mask if tree.width > 1 else None,
                                  layers=feature_layers(drafter))
        if tree.side is not None:
            verified = split_side_rows(verified, tree.size + 1)
        verdict = verify(tree, verified.logits, sampling, generator)
        if tree.width > 1:
            cache.commit(start, torch.tensor(verdict.path, device=target.device))
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


# ----------------------------------------------------------------------------- the trace

# When asked (AR greedy) the trace also keeps the top-1 logit and its gap to the top-2 at every
# committed position, which tells a greedy mismatch at a near tie from a real one.

@dataclass
class Generation:
    """One answer: its tokens, why it stopped, its clock, and one entry per step in each step list."""

    output_ids: list[int]
    prompt_tokens: int
    prefill_s: float
    wall_s: float
    stop_reason: str
    tree_size: list[int] = field(default_factory=list)
    tree_depth: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    top1: list[float] | None = None
    gap: list[float] | None = None

    @property
    def steps(self) -> dict[str, list]:
        return {"tree_size": self.tree_size, "tree_depth": self.tree_depth, "accepted": self.accepted,
                "tokens": self.tokens,
                "draft_ms": [round(x, 3) for x in self.draft_ms],
                "verify_ms": [round(x, 3) for x in self.verify_ms]}

    @property
    def tau(self) -> float:
        return sum(self.tokens) / max(1, len(self.tokens))

    def add_step(self, step: Step) -> None:
        self.tree_size.append(step.tree.size)
        self.tree_depth.append(int(step.tree.depths.max()))  # the deepest path the step could accept
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
