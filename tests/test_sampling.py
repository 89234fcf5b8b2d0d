"""Lossless tree speculative sampling: the joint law of the first 3 generated tokens must equal the
exactly enumerated autoregressive (AR) law, and the same test must catch a deliberately biased rule.

Why this shape:
- A 6-token vocabulary makes every 3-token continuation enumerable (6^3 = 216 cells), so the AR law
  is computed exactly (three levels of plain forwards, each through `processed_probs`, the very
  distribution AR sampling draws from) instead of being estimated from AR samples.
- The draft trees are random (depth <= 2, 1-3 siblings per expanded node), so within the first
  3 tokens the loop hits every branch of the rule: rejection of every sibling then a residual draw,
  acceptance of a later sibling after earlier ones were rejected, a depth-2 accepted path, and a
  fully accepted path whose bonus token is drawn from the leaf's law (and kept). These events are
  counted and asserted, so the statistical check cannot pass vacuously.
- Two drafter flavours: point-mass drafts (q = None; tokens drawn with replacement, so duplicate
  siblings occur) and drafts sampled without replacement from a per-node draft law q reported in
  the tree (see RandomTreeDrafter for how each law is chosen, and why).
- The drafter's RNG is its own, seeded once per test; the loop's generator is seeded per sample
  (`seed=i`). Whatever the drafts, a lossless rule outputs the target law conditionally on them,
  so the samples are i.i.d. draws from the AR law even though the drafter's state carries over.
- Statistic: Pearson chi-square over the 216 cells, cells with expected count < 10 pooled into one
  bin. (>= 5 is the usual validity rule of the chi-square approximation; 10 also keeps the degrees
  of freedom down, which raised the power against the biased rules in simulation.) The p-value
  comes from the regularised incomplete gamma function implemented below (scipy is not a
  dependency). A lossless rule must give p > 1e-3 in each of the 8 cases (family-wise false-alarm
  rate < 1% if the seeds were changed; with fixed seeds the test is deterministic). A biased rule
  must give p < 1e-6: far past the 1e-3 level, so the control shows power with margin, not luck.
- N = 2000 samples per case. One `generate` call costs ~2 ms on this tiny model, so 8 fair cases
  plus 3 biased controls take ~45 s. A faithful model-free replica of the loop (same drafter, same
  rules, logits from the enumerated table) over six other drafter seeds gave chi-square excesses
  (stat - df) of 89..167 on 43 df (p 6e-11 .. 1e-23) for the weakest control (point-mass drafts,
  T = 1, no residual), so the 1e-6 bar holds without seed picking.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import harness.core.verify
from harness.core.decode import GenerationConfig, generate
from harness.core.tree import DraftTree
from harness.core.verify import Sampling, Verdict, processed_probs, sample
from harness.runs import law_check
from harness.runs.law_check import chi2_sf
from methods.common.base import Drafter
from tests.conftest import make_tiny_target

VOCAB = 6
PROMPT = [1, 2, 3, 4]
N_SAMPLES = 2000
ALPHA_FAIR = 1e-3     # a lossless rule must not be rejected at this level
ALPHA_BIASED = 1e-6   # a biased rule must be rejected at this (much stricter) level
MIN_EXPECTED = 10.0   # pool cells whose expected count is below this
CASES = [(0.7, 1.0), (1.0, 1.0), (0.7, 0.8), (1.0, 0.8)]


# ---------------------------------------------------------------------------------- statistics
def pooled_chi2(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """`harness.runs.law_check.pooled_chi2` of counts against exact cell probabilities."""
    obs = observed.double().flatten()
    return law_check.pooled_chi2(obs.tolist(), (probs.double().flatten() * obs.sum()).tolist(), MIN_EXPECTED)


def test_chi2_sf_matches_closed_forms():
    # df = 2: exp(-x/2); df = 1: erfc(sqrt(x/2)); df = 4: (1 + x/2) exp(-x/2).
    for x in (0.01, 0.5, 1.0, 3.0, 10.0, 40.0):
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
        assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
        assert chi2_sf(x, 4) == pytest.approx((1 + x / 2) * math.exp(-x / 2), rel=1e-9)
    # The median of chi-square(100) is about 99.33.
    assert chi2_sf(99.3341, 100) == pytest.approx(0.5, abs=1e-4)


# ---------------------------------------------------------------------------------- exact AR law
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The model's ops are tiny: intra-op threads only add synchronisation, and on the 2 shared
    cores of the test machine their spin-waiting made a run ~10x slower under load."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target(test_device):
    return make_tiny_target(vocab=VOCAB, hidden=32, layers=1, seed=0, device=test_device)


@pytest.fixture(scope="module")
def ar_logits(target):
    """Target logits after the prompt, after prompt + t1, and after prompt + t1 + t2, by plain
    (causal, untreed) forwards: [V], [V, V], [V, V, V]."""
    def last(ids):
        return target.forward(torch.tensor(ids), target.new_cache()).logits[-1].float().cpu()

    l1 = last(PROMPT)
    l2 = torch.stack([last(PROMPT + [a]) for a in range(VOCAB)])
    l3 = torch.stack([torch.stack([last(PROMPT + [a, b]) for b in range(VOCAB)]) for a in range(VOCAB)])
    return l1, l2, l3


def ar_law(ar_logits, temperature: float, top_p: float):
    """The exact joint AR law of the first 3 tokens [V, V, V], and the conditional laws keyed by
    the generated prefix (the drafter uses these to make good drafts)."""
    l1, l2, l3 = ar_logits
    # Guard: numerically, tree forwards differ from plain ones by ~1e-6; a token sitting on the
    # top-p boundary could then be kept by one and cut by the other. Make sure none does.
    if top_p < 1.0:
        for row in torch.cat([l1[None], l2, l3.reshape(-1, VOCAB)]):
            cum = (row / temperature).softmax(-1).sort().values.cumsum(-1)
            assert (cum - (1 - top_p)).abs().min() > 1e-4, "top-p boundary too close: pick another seed"
    p1 = processed_probs(l1, temperature, top_p).double()
    p2 = processed_probs(l2, temperature, top_p).double()
    p3 = processed_probs(l3, temperature, top_p).double()
    joint = p1[:, None, None] * p2[:, :, None] * p3
    cond = {(a,): p2[a].float() for a in range(VOCAB)}
    cond.update({(a, b): p3[a, b].float() for a in range(VOCAB) for b in range(VOCAB)})
    return joint, cond


# ---------------------------------------------------------------------------------- drafter
class RandomTreeDrafter(Drafter):
    """Random trees of depth <= min(2, room) under the root: 1-3 children at the root, each of them
    expanded with probability 0.6 into 1-2 children. `observe` counts which branches of the
    acceptance rule each step exercised.

    sampled=False (point-mass drafts, q=None): tokens drawn with replacement (duplicate siblings
      occur) from 0.9 * p + 0.1 * uniform, p the exact target law at that node (known here: every
      context within 3 tokens is enumerated), so tokens outside the top-p set are drafted too.
      The point-mass rule accepts x with probability p(x), so drafting likely tokens makes deep
      accepted paths common, and makes rejections of likely tokens common too: that is where a
      wrong residual distorts the output most (the negative control relies on it; a noisier
      draft law, measured, roughly halved the control's chi-square excess).
    sampled=True (drafts sampled from q, q reported): q = softmax(N(0, 1) logits), independent of
      the target, so p/q falls on both sides of 1 and the residual max(0, p - q) is far from p;
      tokens drawn from q without replacement, in child order, as the tree's q contract says."""

    name = "random-tree"
    defaults = {"sampled": False, "seed": 0}

    def __init__(self, target, config, cond):
        super().__init__(target, config)
        self.rng = torch.Generator().manual_seed(self.config["seed"])
        self.cond = cond
        self.events: Counter = Counter()
        self._room = 0

    def _uniform(self) -> float:
        return float(torch.rand((), generator=self.rng))

    def _draft_law(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if self.config["sampled"]:
            return torch.randn(VOCAB, generator=self.rng).softmax(-1)
        return 0.9 * self.cond[prefix] + 0.1 / VOCAB

    def _draw(self, q: torch.Tensor, k: int) -> list[int]:
        if not self.config["sampled"]:
            return torch.multinomial(q, k, replacement=True, generator=self.rng).tolist()
        # Sequentially, without replacement: the i-th child is drawn from q with the earlier ones removed.
        q, out = q.clone(), []
        for _ in range(k):
            x = sample(q / q.sum(), self.rng)
            out.append(x)
            q[x] = 0.0
        return out

    def propose(self, ctx) -> DraftTree:
        self._room = ctx.max_nodes
        generated = tuple(ctx.tokens[len(PROMPT):])  # root last
        tokens, parents, laws = [ctx.root], [-1], {}
        laws[0] = self._draft_law(generated)
        kids = self._draw(laws[0], 1 + int(3 * self._uniform()))
        depth1 = []
        for x in kids:
            tokens.append(x)
            parents.append(0)
            depth1.append(len(tokens) - 1)
        if ctx.max_nodes >= 2:
            for node in depth1:
                if self._uniform() < 0.6:
                    laws[node] = self._draft_law(generated + (tokens[node],))
                    for x in self._draw(laws[node], 1 + int(2 * self._uniform())):
                        tokens.append(x)
                        parents.append(node)
        q = None
        if self.config["sampled"]:
            q = torch.full((len(tokens), VOCAB), 1.0 / VOCAB)  # rows of childless nodes: anything
            for node, law in laws.items():
                q[node] = law
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), q=q)

    def observe(self, step) -> None:
        kids = step.tree.children
        last = step.path[-1]
        bonus_kept = step.accepted + 1 <= self._room  # the loop cuts the step at max_new_tokens
        if kids[last]:
            self.events["residual"] += 1  # every child of `last` rejected: bonus from the residual
        elif bonus_kept:
            self.events["leaf_bonus"] += 1  # whole path accepted: bonus from the leaf's law
        for a, b in zip(step.path, step.path[1:]):
            if kids[a][0] != b:
                self.events["accept_after_reject"] += 1
        if step.accepted == 2:
            self.events["depth2"] += 1


def sample_counts(target, drafter, temperature: float, top_p: float) -> tuple[torch.Tensor, int]:
    """Counts of the first 3 sampled tokens over N_SAMPLES generations, and the drafts accepted."""
    counts = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.long)
    sampling = Sampling(temperature, top_p, "lossless")
    accepted = 0
    for i in range(N_SAMPLES):
        gen = generate(target, PROMPT, GenerationConfig(3, sampling=sampling, seed=i), drafter)
        assert len(gen.output_ids) == 3
        counts[tuple(gen.output_ids)] += 1
        accepted += sum(gen.accepted)
    return counts, accepted


def run_case(target, ar_logits, temperature, top_p, sampled, seed):
    joint, cond = ar_law(ar_logits, temperature, top_p)
    drafter = RandomTreeDrafter(target, {"sampled": sampled, "seed": seed}, cond)
    counts, _ = sample_counts(target, drafter, temperature, top_p)
    impossible = int(counts[joint == 0].sum())
    return counts, joint, drafter.events, impossible


# ---------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("sampled", [False, True], ids=["point-mass", "sampled-q"])
@pytest.mark.parametrize("temperature,top_p", CASES)
def test_tree_sampling_matches_exact_ar_law(target, ar_logits, temperature, top_p, sampled):
    seed = 1000 + 10 * CASES.index((temperature, top_p)) + int(sampled)
    counts, joint, events, impossible = run_case(target, ar_logits, temperature, top_p, sampled, seed)
    stat, df, p = pooled_chi2(counts, joint)
    print(f"fair T={temperature} top_p={top_p} sampled={sampled}: chi2={stat:.1f} df={df} p={p:.3g} {dict(events)}")
    # Every branch of the rule was exercised within the first 3 tokens.
    for event in ("residual", "leaf_bonus", "accept_after_reject", "depth2"):
        assert events[event] >= 50, f"too few '{event}' steps: {dict(events)}"
    assert impossible == 0, "sampled a sequence the AR sampler gives probability 0 (outside top-p)"
    assert p > ALPHA_FAIR, f"speculative sampling differs from the AR law: chi2={stat:.1f}, df={df}, p={p:.3g}"


def verify_biased(kind: str):
    """A variant of recursive rejection sampling with one deliberate bug:
    'no-residual': after a rejection the rejected mass is not removed (the next sibling and the
                   bonus see the unmodified target law);
    'over-accept': drafts are accepted with probability min(1, 1.5 * p(x) / q(x));
    'raw-bonus':   the official EAGLE bug: when the whole path is accepted, the bonus token is drawn
                   from the leaf's raw logits, skipping the temperature/top-p processor."""
    def rule(tree, logits, temperature, top_p, generator):
        tokens = tree.tokens.tolist()
        node, path = 0, [0]
        p = processed_probs(logits[0], temperature, top_p).cpu()  # as the real rule reads it
        while True:
            kids = tree.children[node]
            q = tree.q[node].float().clone() if (tree.q is not None and kids) else None
            chosen = None
            for c in kids:
                x = tokens[c]
                ratio = p[x] if q is None else p[x] / q[x].clamp_min(1e-30)
                if kind == "over-accept":
                    ratio = 1.5 * ratio
                if float(torch.rand((), generator=generator)) < float(ratio):
                    chosen = c
                    break
                if kind != "no-residual":
                    if q is None:
                        p = p.clone()
                        p[x] = 0.0
                    else:
                        p = (p - q).clamp_min(0.0)
                    p = p / p.sum()
                if q is not None:
                    q[x] = 0.0
                    q = q / q.sum()
            if chosen is None:
                if kind == "raw-bonus" and not kids:
                    p = torch.softmax(logits[node].float(), -1).cpu()
                return Verdict(path, sample(p, generator))
            node = chosen
            path.append(node)
            p = processed_probs(logits[node], temperature, top_p).cpu()

    return rule


@pytest.mark.parametrize("kind,sampled,temperature,top_p", [
    ("no-residual", False, 1.0, 1.0),  # the case the issue names: point-mass drafts at T = 1
    ("over-accept", False, 1.0, 1.0),  # a wrong acceptance probability rather than a wrong residual
    ("no-residual", True, 0.7, 0.8),   # the draft-distribution branch (residual max(0, p - q)), with top-p
    ("raw-bonus", False, 0.7, 0.8),    # issue 5: the official last-bonus token skips temperature/top-p
], ids=["no-residual-point-mass-T1", "over-accept-point-mass-T1", "no-residual-sampled-q-T0.7-top-p0.8",
        "raw-bonus-point-mass-T0.7-top-p0.8"])
def test_biased_rule_is_rejected(target, ar_logits, monkeypatch, kind, sampled, temperature, top_p):
    # The same statistic, samples and seeds as the fair case, with the rule swapped: `generate` calls
    # harness.core.verify.verify, which looks verify_lossless up by module-global name.
    monkeypatch.setattr(harness.core.verify, "verify_lossless", verify_biased(kind))
    seed = 1000 + 10 * CASES.index((temperature, top_p)) + int(sampled)  # the fair case's seed
    counts, joint, events, impossible = run_case(target, ar_logits, temperature, top_p, sampled, seed)
    stat, df, p = pooled_chi2(counts, joint)
    print(f"biased {kind} T={temperature} top_p={top_p} sampled={sampled}: chi2={stat:.1f} df={df} p={p:.3g}")
    if kind == "raw-bonus":  # untruncated bonus draws land outside top-p: caught either way
        assert impossible > 0 or p < ALPHA_BIASED, f"the test failed to catch '{kind}': p={p:.3g}"
        return
    assert impossible == 0
    assert p < ALPHA_BIASED, f"the test failed to catch the '{kind}' bias: chi2={stat:.1f}, df={df}, p={p:.3g}"


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_eagle2_tree_sampling_matches_exact_ar_law(target, ar_logits, temperature, top_p):
    """The same check with a real EAGLE-2 drafter: its dynamic tree (beam + rerank, point-mass
    drafts) verified by the recursive rejection rule must leave the AR law of the first 3 tokens
    untouched. Random draft weights still propose plausible tokens on a 6-token vocabulary, and the
    accepted-draft count guards against a vacuous pass."""
    from methods.eagle2 import Eagle2

    torch.manual_seed(7)
    drafter = Eagle2(target, {"top_k": 3, "depth": 2, "total_tokens": 8, "draft_vocab": 0})
    joint, _ = ar_law(ar_logits, temperature, top_p)
    counts, accepted = sample_counts(target, drafter, temperature, top_p)
    stat, df, p = pooled_chi2(counts, joint)
    print(f"eagle2 T={temperature} top_p={top_p}: chi2={stat:.1f} df={df} p={p:.3g} accepted={accepted}")
    assert accepted >= N_SAMPLES // 8, f"too few accepted drafts ({accepted}) for the check to mean anything"
    assert int(counts[joint == 0].sum()) == 0, "sampled a sequence outside top-p"
    assert p > ALPHA_FAIR, f"EAGLE-2 speculative sampling differs from the AR law: chi2={stat:.1f}, df={df}, p={p:.3g}"


@pytest.mark.parametrize("temperature,top_p,draft,biased", [
    (1.0, 1.0, "far", False), (0.7, 0.8, "near", False), (1.0, 1.0, "far", True)],
    ids=["T1-far-draft", "T0.7-top-p0.8-near-draft", "no-residual-control-T1-far-draft"])
def test_sps_chain_sampling_matches_exact_ar_law(target, ar_logits, monkeypatch, temperature, top_p, draft, biased):
    """SpS: drafts sampled from another tiny LM's law q, verified with the min(1, p/q) rule and the
    max(0, p - q) residual, must leave the AR law untouched; the same samples under the
    no-residual bug must not. "far": an unrelated LM (another seed), so p/q falls on both sides of
    1 and the residual is far from p (where that bug shows most); "near": the target's weights plus
    noise, as a same-family draft is (at T = 0.7 with top-p the far draft is accepted too rarely)."""
    from methods.sps import SpeculativeSampling
    from tests.test_sps import perturbed_draft

    model = make_tiny_target(vocab=VOCAB, hidden=32, layers=1, seed=1) if draft == "far" else \
        perturbed_draft(target, scale=0.3)
    drafter = SpeculativeSampling(target, {"draft": "tiny", "gamma": 2}, draft=model)
    if biased:
        monkeypatch.setattr(harness.core.verify, "verify_lossless", verify_biased("no-residual"))
    joint, _ = ar_law(ar_logits, temperature, top_p)
    counts, accepted = sample_counts(target, drafter, temperature, top_p)
    stat, df, p = pooled_chi2(counts, joint)
    print(f"sps T={temperature} top_p={top_p} {draft} biased={biased}: chi2={stat:.1f} df={df} p={p:.3g} "
          f"accepted={accepted}")
    # One draft per sample fits the room of 3 tokens: both accepting and rejecting it must be common.
    assert N_SAMPLES // 8 <= accepted <= N_SAMPLES - N_SAMPLES // 8, f"accepted {accepted} of {N_SAMPLES} drafts"
    if biased:
        assert p < ALPHA_BIASED, f"the test failed to catch the no-residual bias under sps: p={p:.3g}"
        return
    assert int(counts[joint == 0].sum()) == 0, "sampled a sequence outside top-p"
    assert p > ALPHA_FAIR, f"sps speculative sampling differs from the AR law: chi2={stat:.1f}, df={df}, p={p:.3g}"
