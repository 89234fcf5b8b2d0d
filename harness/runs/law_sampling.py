"""The law of an answer's first tokens under a drafter, sampled fast, against AR's law: what
`cli.py check-method` and scripts/check_lossless_law.py test losslessness with at T > 0.

- Samples: the loop's own `prefill` and first `speculative_step` (harness/core/decode.py) with the
  drafter and the room of a 128-token answer, seed i for sample i. (Not `generate(...,
  max_new_tokens=2)`: with room for one token no drafter proposes anything.) Work that does not
  depend on the sample's random draws is done once: target forwards per distinct input
  (ForwardReplay), a drafter's tree per root when it drew nothing from the generator (RootMemo);
  what remains per sample is the acceptance rule and its draws.
- `sample_pits` (check-method): every token the step emits after the root (t2, t3, ... up to the
  deepest accepted draft and its bonus) becomes a randomised PIT value under AR's law after its
  own prefix (harness/runs/law_check.py), so every accepted depth is tested, not just the first.
- `exact_law` / `sample_counts` / `law_fit` (the script, the GPU check): the exact AR law of
  (t1, t2): t1 ~ processed_probs(prefill logits), t2 ~ processed_probs(logits after t1). Every t1
  with probability >= T1_MIN is expanded with one target forward; cells of joint probability >=
  CELL_MIN are listed, the rest of the mass forms one "other" cell, and cells expected below 10
  counts are pooled (law_check).
"""
from __future__ import annotations

import random
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.core.decode import Answer, GenerationConfig, prefill, speculative_step
from harness.core.target import Target
from harness.core.verify import Sampling, processed_probs
from harness.runs.law_check import pit, pooled_chi2

ALPHA_FAIR = 1e-3  # a lossless method must not be rejected at this level
T1_MIN, CELL_MIN = 1e-3, 1e-5
ROOM = 127  # tokens left after the first one in a 128-token answer


class ForwardReplay:
    """Target.forward that memoises what every sample recomputes. A sample makes at most two target
    forwards: the prompt's prefill into an empty cache (with any side rows a drafter runs after the
    prompt, Lookahead's first window: the loop then crops the cache back to the prompt), then one
    verify on top of exactly that prefix. Both are functions of their inputs alone (the cached
    prefix is the same prompt), so each distinct input is computed once and its output and new KV
    rows replayed afterwards (bit-identical to recomputing: same kernels, same inputs, same thread
    count). Anything else (a second step, another prefix) runs for real. With a deterministic tree
    per root (top-k trees, pld) a sample then costs one draft; a drafter that samples its tree just
    misses the memo."""

    def __init__(self, target: Target, prompt: list[int], max_entries: int = 256) -> None:
        self.real = target.forward
        self.prompt = torch.tensor(prompt)
        self.prefill = None  # (key of its inputs, (output, KV rows))
        self.steps: OrderedDict = OrderedDict()  # LRU: a verify's logits are ~12 MB
        self.max_entries = max_entries
        self.pristine = None  # the cache that holds the prompt's prefill and nothing else
        self.computed = self.replayed = 0

    def __call__(self, input_ids, cache, position_ids=None, tree_mask=None, logits="all", layers=None):
        n_prompt = self.prompt.numel()
        key = tuple(None if t is None else (tuple(t.shape), t.cpu().numpy().tobytes())
                    for t in (input_ids, position_ids, tree_mask)) + (logits, tuple(layers or ()))
        if cache.length == 0 and input_ids.numel() >= n_prompt and torch.equal(input_ids[:n_prompt].cpu(), self.prompt):
            entry = self.prefill[1] if self.prefill is not None and self.prefill[0] == key else None
            self.prefill = (key, self._run_or_replay(entry, input_ids, cache, position_ids, tree_mask, logits, layers))
            self.pristine = cache
            return self.prefill[1][0]
        if cache is self.pristine and cache.length == n_prompt:
            self.pristine = None
            entry = self.steps.pop(key, None)
            entry = self._run_or_replay(entry, input_ids, cache, position_ids, tree_mask, logits, layers)
            self.steps[key] = entry
            if len(self.steps) > self.max_entries:
                self.steps.popitem(last=False)
            return entry[0]
        self.pristine = None
        self.computed += 1
        return self.real(input_ids, cache, position_ids=position_ids, tree_mask=tree_mask, logits=logits,
                         layers=layers)

    def _run_or_replay(self, entry, input_ids, cache, position_ids, tree_mask, logits, layers):
        start = cache.length
        if entry is None:
            self.computed += 1
            out = self.real(input_ids, cache, position_ids=position_ids, tree_mask=tree_mask, logits=logits,
                            layers=layers)
            kv = [(layer.keys[:, :, start:cache.length].clone(), layer.values[:, :, start:cache.length].clone())
                  for layer in cache.layers]
            return out, kv
        self.replayed += 1
        out, kv = entry
        for layer, (k, v) in zip(cache.layers, kv):
            layer.update(k, v)
        return entry


class RootMemo:
    """A drafter as the check uses it (one speculative step per sample): `begin` + `propose` run
    once per root when `propose` draws nothing from the sample's generator, since the tree is then
    a function of the prompt and the root alone (top-k trees, pld), and once per sample otherwise
    (EAGLE-1 samples its children at T > 0). Whether the generator was used is checked on every
    call, from its state, so no drafter is assumed deterministic. Nothing follows the step, so
    `observe` has nothing to update."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.trees: dict[int, object] = {}
        self.pending = None
        self.computed = self.reused = 0

    def begin(self, prompt, prefill, root: int) -> None:
        self.pending = (prompt, prefill, root)

    def propose(self, ctx):
        if ctx.root in self.trees:
            self.reused += 1
            return self.trees[ctx.root]
        self.drafter.begin(*self.pending)
        before = ctx.generator.get_state() if ctx.generator is not None else None
        tree = self.drafter.propose(ctx)
        self.computed += 1
        if before is None or torch.equal(before, ctx.generator.get_state()):
            self.trees[ctx.root] = tree
        return tree

    def observe(self, step) -> None:
        pass

    def __getattr__(self, name: str):
        # what the loop reads off a drafter besides the protocol (its config, target layers)
        return getattr(self.__dict__["drafter"], name)


@torch.inference_mode()
def exact_law(target: Target, prompt: list[int], temperature: float, top_p: float) -> dict[tuple[int, int], float]:
    cache = target.new_cache(capacity=len(prompt) + 4)
    p1 = processed_probs(target.forward(torch.tensor(prompt), cache, logits="last").logits[-1], temperature, top_p)
    base = cache.length
    law = {}
    for t1 in (p1 >= T1_MIN).nonzero().flatten().tolist():
        p2 = processed_probs(target.forward(torch.tensor([t1]), cache).logits[-1], temperature, top_p)
        cache.crop_to(base)
        joint = float(p1[t1]) * p2
        for t2 in (joint >= CELL_MIN).nonzero().flatten().tolist():
            law[(t1, t2)] = float(joint[t2])
    return law


def sample_counts(target: Target, prompt: list[int], drafter, sampling: Sampling, n: int) -> tuple[Counter, int]:
    """Counts of (t1, t2) over n samples, and how many samples accepted a draft in the step that
    made t2. Each sample is the loop's own prefill and first speculative step (seed i), with the
    room a 128-token answer has, so the drafter proposes its full tree; t2 is that step's first
    token (an accepted draft or the bonus)."""
    counts: Counter = Counter()
    accepted = 0
    cfg = GenerationConfig(1 + ROOM, sampling)
    for i in range(n):
        generator = torch.Generator().manual_seed(i)
        cache, _, root = prefill(target, prompt, cfg, generator, drafter)
        if root in target.eos_token_ids:
            counts[(root, -1)] += 1
            continue
        answer = Answer(target, cfg, target.eos_token_ids, [root], list(prompt) + [root])
        step = speculative_step(target, cache, drafter, answer, root, sampling, generator, ROOM)
        counts[(root, answer.ids[1])] += 1
        accepted += step.verdict.accepted > 0
    return counts, accepted


def law_fit(counts: Counter, law: dict[tuple[int, int], float], n: int) -> tuple[float, int, float]:
    """Pearson chi-square (statistic, df, p) of n samples' (t1, t2) counts against the exact law; the
    law's unlisted mass is one "other" cell."""
    cells = list(law)
    observed = [counts.get(c, 0) for c in cells] + [n - sum(counts.get(c, 0) for c in cells)]
    expected = [n * law[c] for c in cells] + [n * max(0.0, 1.0 - sum(law.values()))]
    return pooled_chi2(observed, expected)


@dataclass
class LawSamples:
    """PIT values of the emitted tokens by position (2: the first token after the root), and how
    many of the samples accepted a draft."""

    n: int = 0
    accepted: int = 0
    pits: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))


class CleanLaw:
    """AR's logits after the prompt + some tokens, from forwards of their own (memoised by tokens):
    the reference for a tree whose extra attention edges make its verify rows other than AR's."""

    def __init__(self, target: Target, prompt: list[int]) -> None:
        self.target, self.prompt = target, prompt
        self.cache = None
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(self, tokens: list[int]) -> torch.Tensor:
        """[len(tokens), V]: row j is AR's logits after prompt + tokens[: j + 1]."""
        key = tuple(tokens)
        if key not in self.memo:
            forward = type(self.target).forward  # the class's, never a replay installed on the instance
            if self.cache is None:
                self.cache = self.target.new_cache(capacity=len(self.prompt) + ROOM + 8)
                forward(self.target, torch.tensor(self.prompt), self.cache, logits="last")
            base = self.cache.length
            self.memo[key] = forward(self.target, torch.tensor(tokens), self.cache).logits
            self.cache.crop_to(base)
        return self.memo[key]


@torch.inference_mode()
def sample_pits(target: Target, prompt: list[int], drafter, sampling: Sampling, n: int,
                budget: int | None = None, first_seed: int = 0,
                enough: Callable[[], bool] = lambda: False) -> LawSamples:
    """n samples, or fewer once `enough()` (seed first_seed + i: the loop's prefill and first
    speculative step, with `budget` as every proposal's DraftContext.budget); each token the step
    keeps becomes a PIT value under AR's law after its prefix: the verify's own row on the accepted
    path (a path's ancestor mask is the causal mask, so that row is AR's), or a clean forward where
    the tree adds attention edges."""
    out = LawSamples()
    rng = random.Random(first_seed)
    cfg = GenerationConfig(1 + ROOM, sampling, tree_budget=budget)
    clean = CleanLaw(target, prompt)
    for i in range(first_seed, first_seed + n):
        generator = torch.Generator().manual_seed(i)
        cache, _, root = prefill(target, prompt, cfg, generator, drafter)
        if root in target.eos_token_ids:
            continue
        answer = Answer(target, cfg, target.eos_token_ids, [root], list(prompt) + [root])
        step = speculative_step(target, cache, drafter, answer, root, sampling, generator, ROOM)
        emitted = answer.ids[1:]
        tree = step.tree
        rows = (clean.logits([root] + emitted[:-1]) if (tree.extra_mask or tree.extra_children)
                else step.verified.logits[step.verdict.path[: len(emitted)]])
        for j, x in enumerate(emitted):
            out.pits[j + 2].append(pit(processed_probs(rows[j], sampling.temperature, sampling.top_p), x, rng.random()))
        out.n += 1
        out.accepted += step.verdict.accepted > 0
        if enough():
            break
    return out
