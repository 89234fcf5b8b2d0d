"""The law check of `cli.py check-method`: where to sample so that it has power, and the verdict.

At T > 0 a point-mass draft x is accepted with the target's probability p(x) (a sampled one with
min(p, q) of its mass), so a sample says something about the acceptance rule only where drafts
get accepted: on a context where the target is sure of its next tokens and the drafter guesses
them. The candidates:
  - the contexts of the card's greedy answers where the drafter's step at T = 0 accepted the most
    drafts (LAW_CANDIDATES of them, one per prompt);
  - on a target with a tokenizer, a prompt asking for a passage to be repeated, followed by AR's
    first greedy tokens: its continuation repeats text the drafter can see.
Each is tried at each T of LAW_TEMPERATURES with PILOT samples; the `law_samples` samples (other
seeds than the pilot's, so the choice does not bias them) run where the share of samples
accepting a draft was highest, or fewer once FRESH_TREES samples needed a tree of their own: a
drafter that samples its tree costs a propose and a target forward per sample (one per distinct
root otherwise), and its draws are also tested, without the target, by the q check. Each token the first speculative step emits after the root is a
PIT value under AR's law after its prefix (harness/runs/law_sampling.py:sample_pits); each token
position with MIN_TESTED values, and the tokens from the third on pooled, is tested for uniformity,
Bonferroni over the tests. Below EXERCISED samples accepting a draft even on the best candidate,
the check fails: it cannot vouch for a law it did not exercise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.core.decode import GenerationConfig, generate
from harness.core.target import Target
from harness.core.verify import Sampling
from harness.runs.law_check import detectable_shift, uniformity_test
from harness.runs.law_sampling import ALPHA_FAIR, ForwardReplay, LawSamples, RootMemo, sample_pits

LAW_TEMPERATURES = (1.0, 0.5)
LAW_CANDIDATES = 3     # greedy-answer contexts tried
PILOT = 16             # samples per candidate and temperature
FRESH_TREES = 400      # final samples of a drafter whose every sample draws a new tree
EXERCISED = 0.1        # share of samples that must accept a draft
MIN_TESTED = 50        # PIT values a token position needs to be tested
FINAL_SEEDS = 1_000_000  # the final samples' seeds start here (the pilot's at 0)
REPEAT_PREFIX = 8      # AR tokens after the repeat prompt
REPEAT_TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, lit the great lamp, "
               "wrote the weather in his logbook, and watched the fishing boats return to the harbour one "
               "by one before the tide turned.")


@dataclass
class LawFound:
    label: str
    temperature: float
    samples: LawSamples
    pilot: list[tuple[str, float, float]] = field(default_factory=list)  # (label, T, share accepting)


def law_candidates(target: Target, contexts: list[tuple[str, list[int], int]]) -> list[tuple[str, list[int]]]:
    """(label, law prompt) to try: `contexts` are (prompt label, context with its root last, drafts
    the greedy step there accepted); the best LAW_CANDIDATES prompts' best context each, cut before
    its root (the samples draw the root), then the repeat prompt where there is a tokenizer."""
    best: dict[str, tuple[list[int], int]] = {}
    for label, context, accepted in contexts:  # ties: the later context (more of the answer to repeat)
        if label not in best or accepted >= best[label][1]:
            best[label] = (context, accepted)
    ranked = sorted(best.items(), key=lambda kv: -kv[1][1])[:LAW_CANDIDATES]
    out = [(f"{label}, after {len(c) - 1} tokens (greedy step accepted {a})", c[:-1]) for label, (c, a) in ranked]
    if target.tokenizer is not None:
        prompt = target.encode_chat([{"role": "user", "content": f"Repeat this text exactly:\n\n{REPEAT_TEXT}"}])
        prefix = generate(target, prompt, GenerationConfig(REPEAT_PREFIX)).output_ids
        out.append((f"a repeat prompt + {len(prefix)} AR tokens", prompt + prefix))
    return out


def sample_at(target: Target, drafter, prompt: list[int], temperature: float, n: int, budget: int | None,
              first_seed: int, fresh: int | None = None) -> LawSamples:
    """`sample_pits` with the target's forwards memoised for this prompt and the drafter's trees per
    root, stopping early once `fresh` trees had to be proposed anew."""
    target.forward = ForwardReplay(target, prompt)  # memoised per distinct input: the samples differ only in their draws
    memo = RootMemo(drafter)
    try:
        return sample_pits(target, prompt, memo, Sampling(temperature, 1.0, "lossless"), n, budget, first_seed,
                           lambda: fresh is not None and memo.computed >= fresh)
    finally:
        del target.forward  # back to the class's method


def search_and_sample(target: Target, drafter, candidates: list[tuple[str, list[int]]], n: int,
                      budget: int | None) -> LawFound:
    """The pilot over candidates and temperatures, then `n` samples where drafts were accepted most."""
    pilot, best = [], None
    for label, prompt in candidates:
        for t in LAW_TEMPERATURES:
            s = sample_at(target, drafter, prompt, t, PILOT, budget, 0)
            share = s.accepted / max(1, s.n)
            pilot.append((label, t, share))
            if best is None or share > best[0]:
                best = (share, label, prompt, t)
    _, label, prompt, t = best
    return LawFound(label, t, sample_at(target, drafter, prompt, t, n, budget, FINAL_SEEDS, FRESH_TREES), pilot)


def law_verdict(found: LawFound, resumable: bool = True) -> tuple[str, str]:
    """(status, detail) of the law row. A drafter that is not `resumable` is sampled from a fresh
    start, not from the state a long answer gives it: too few accepted drafts there is a warning."""
    s = found.samples
    share = s.accepted / max(1, s.n)
    where = (f"{s.n} samples at T={found.temperature:g} on {found.label} (the best of {len(found.pilot)} "
             f"contexts x temperatures tried); a draft accepted in {share:.0%} of them")
    tests = {f"token {k}": v for k, v in sorted(s.pits.items()) if len(v) >= MIN_TESTED}
    later = [u for k, v in s.pits.items() if k >= 3 for u in v]
    if len(later) >= MIN_TESTED and len([k for k in s.pits if k >= 3]) > 1:
        tests["tokens 3+"] = later
    if not tests:
        return "fail", f"lossless: no token position has {MIN_TESTED} samples to test: {where}"
    alpha = ALPHA_FAIR / len(tests)
    results = {name: uniformity_test(v) for name, v in tests.items()}
    name, (stat, df, p) = min(results.items(), key=lambda kv: kv[1][2])
    if p < alpha:
        return "fail", (f"lossless: the output does not follow AR's law at {name} (PIT chi2 {stat:.1f} on {df} df, "
                        f"p = {p:.2g} < {alpha:.2g}, {len(tests[name])} samples): {where}")
    if share < EXERCISED and not resumable:
        return "warn", (f"weakly exercised: {where}, under {EXERCISED:.0%}; its proposals rest on earlier forwards "
                        "(`resumable = False`), so each sample starts it afresh, where it has little to draft from: "
                        "no bias was found, but the card cannot vouch for the law of a long answer's drafts")
    if share < EXERCISED:
        return "fail", (f"weakly exercised: {where}, under {EXERCISED:.0%}: the card cannot vouch for a law its "
                        "drafts barely reach")
    deepest = max(int(k.split()[-1]) for k in tests if k.split()[-1].isdigit())
    tokens = "token 2 follows" if deepest == 2 else f"tokens 2-{deepest} follow"
    power = ", ".join(f"{detectable_shift(len(v), alpha):.0%} at {k} ({len(v)} samples)"
                      for k, v in tests.items() if k in ("token 2", "tokens 3+"))
    return "pass", (f"{where}; {tokens} AR's law in {len(tests)} PIT tests (smallest p = {p:.2g}, "
                    f"level {alpha:.2g}); 80% power against moving this much of the law's mass between PIT bins: "
                    f"{power}")
