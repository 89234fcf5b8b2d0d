"""Greedy answers to the first MT-Bench and GSM8K questions with a drafter, held to AR (the
`-m smollm2` tests of the training-free drafters)."""
from __future__ import annotations

from harness.core.decode import GenerationConfig, generate


def greedy_tau(target, data, drafter, benchmarks=("mt_bench", "gsm8k"), max_new_tokens: int = 64) -> float:
    """Tokens per verify of `drafter` over the first question of each benchmark; asserts every
    answer is AR's, token for token."""
    from harness.runs.benchmarks import load_questions

    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    tokens = steps = 0
    for bench in benchmarks:
        q = load_questions(bench, data, limit=1)[0]
        p = target.encode_chat([{"role": "user", "content": q.turns[0]}])
        sp = generate(target, p, cfg, drafter)
        assert sp.output_ids == generate(target, p, cfg).output_ids, f"{bench} {q.question_id}: differs from AR"
        tokens, steps = tokens + len(sp.output_ids), steps + len(sp.tokens)
    return tokens / steps
