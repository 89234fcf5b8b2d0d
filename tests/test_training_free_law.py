"""Token Recycling, REST and SAM-Decoding at T > 0: their drafts are deterministic (point mass,
q = None), so the shared verifier's recursive rejection must leave the AR law of the first 3
tokens untouched (the exact-law check of tests/test_sampling.py, on its 6-token target). Each
drafter is set up so that drafts are accepted often (asserted, so the check is not vacuous):
Token Recycling and SAM-Decoding's auxiliary keep their matrix across the samples, REST's
datastore and SAM-Decoding's corpus hold sampled continuations of the prompt."""
from __future__ import annotations

import pytest

from harness.core.decode import GenerationConfig, generate
from harness.core.verify import Sampling
from methods.common.token_index import TokenIndex
from methods.recycling import TokenRecycling
from methods.rest import Rest
from methods.samd import SamDecoding
from tests.test_sampling import (  # noqa: F401 - fixtures
    ALPHA_FAIR, N_SAMPLES, PROMPT, ar_law, ar_logits, one_thread, pooled_chi2, sample_counts, target)


def sampled_corpus(target, n: int = 60) -> list[list[int]]:
    """Continuations of the prompt sampled at T = 1: what follows it, as the target would go on."""
    return [PROMPT + generate(target, PROMPT, GenerationConfig(8, sampling=Sampling(1.0, 1.0, "lossless"),
                                                               seed=10_000 + i)).output_ids for i in range(n)]


def build(kind: str, target, tmp_path):
    if kind == "recycling":
        return TokenRecycling(target, {"keep_across_answers": True, "tree": [[0], [1], [0, 0], [1, 0], [0, 0, 0]]})
    TokenIndex.build(sampled_corpus(target), {"vocab_hash": target.vocab_hash()}).save(tmp_path / "ds")
    if kind == "rest":
        return Rest(target, {"datastore": str(tmp_path / "ds"), "min_span": 1, "num_draft": 6})
    aux = TokenRecycling(target, {"keep_across_answers": True, "tree": [[0], [1], [0, 0]]})
    return SamDecoding(target, {"corpus": str(tmp_path / "ds"), "len_bias": 0, "len_threshold": 2,
                                "n_predicts": 4}, aux=aux)


@pytest.mark.parametrize("kind", ["recycling", "rest", "samd"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_training_free_sampling_matches_exact_ar_law(target, ar_logits, tmp_path, kind, temperature, top_p):
    drafter = build(kind, target, tmp_path)
    joint, _ = ar_law(ar_logits, temperature, top_p)
    counts, accepted = sample_counts(target, drafter, temperature, top_p)
    stat, df, p = pooled_chi2(counts, joint)
    print(f"{kind} T={temperature} top_p={top_p}: chi2={stat:.1f} df={df} p={p:.3g} accepted={accepted}")
    assert accepted >= N_SAMPLES // 4, f"too few accepted drafts ({accepted}) for the check to mean anything"
    assert int(counts[joint == 0].sum()) == 0, "sampled a sequence outside top-p"
    assert p > ALPHA_FAIR, f"{kind} speculative sampling differs from the AR law: chi2={stat:.1f}, df={df}, p={p:.3g}"


@pytest.mark.parametrize("kind", ["recycling", "rest", "samd"])
def test_the_law_check_catches_a_biased_rule_with_these_drafts(target, ar_logits, tmp_path, monkeypatch, kind):
    """The same samples under a rule that accepts every draft must fail: the drafts are informative
    enough, and accepted often enough, for the check above to have power."""
    import harness.core.decode
    from harness.core.verify import Verdict, verify_lossless

    def accept_all(tree, logits, sampling, generator=None):
        v = verify_lossless(tree, logits, sampling.temperature, sampling.top_p, generator)
        node, path = 0, [0]
        while tree.children[node]:
            node = tree.children[node][0]
            path.append(node)
        return v if len(path) == 1 else Verdict(path, v.bonus)

    monkeypatch.setattr(harness.core.decode, "verify", accept_all)
    drafter = build(kind, target, tmp_path)
    joint, _ = ar_law(ar_logits, 1.0, 1.0)
    counts, _ = sample_counts(target, drafter, 1.0, 1.0)
    stat, df, p = pooled_chi2(counts, joint)
    assert p < 1e-6, f"{kind}: a rule that accepts every draft went unnoticed (p={p:.3g})"
