"""`cli.py bench` pieces that carry a claim: the weight bytes behind the bandwidth floor, and the
contests against transformers (same outputs as plain decoding for every contender)."""
from __future__ import annotations

import pytest
import torch

from harness.runs.bench import contest, hf_generate, ours_generate, copy_bandwidth, output_agreement, weight_bytes
from methods.sps import SpeculativeSampling
from tests.test_exactness import prompts
from tests.test_sps import perturbed_draft


def test_weight_bytes_counts_each_tensor_once(tiny_target):
    params = list(tiny_target.model.parameters())
    assert weight_bytes(tiny_target) == sum(p.numel() * p.element_size() for p in params)
    # Tying the LM head to the embedding must not count the shared matrix twice.
    model = tiny_target.model
    untied = model.lm_head.weight
    model.lm_head.weight = model.model.embed_tokens.weight
    try:
        assert weight_bytes(tiny_target) == sum(p.numel() * p.element_size() for p in params) - untied.numel() * 4
    finally:
        model.lm_head.weight = untied


def test_copy_bandwidth_is_a_plausible_rate():
    bw = copy_bandwidth(torch.device("cpu"), megabytes=16, repeats=3)
    assert 1e8 < bw < 1e13  # between 0.1 GB/s and 10 TB/s: a rate, not a unit slip


def test_sps_and_hf_assisted_generation_agree_with_plain_decoding(tiny_target):
    draft = perturbed_draft(tiny_target)
    drafter = SpeculativeSampling(tiny_target, {"draft": "tiny", "gamma": 4}, draft=draft)
    ps = prompts(tiny_target.vocab_size, n=3)
    res = contest(tiny_target, ps, 24, {
        "ar": lambda p, n: ours_generate(tiny_target, p, n),
        "ours": lambda p, n: ours_generate(tiny_target, p, n, drafter),
        "hf": lambda p, n: hf_generate(tiny_target, p, n),
        "hf_spec": lambda p, n: hf_generate(tiny_target, p, n, assistant_model=draft.model),
    }, repeats=1)
    assert res["ar"]["outputs"] == res["ours"]["outputs"] == res["hf"]["outputs"] == res["hf_spec"]["outputs"]
    assert res["ours"]["tau"] > 1.0 and res["hf_spec"]["tau"] > 1.0
    assert res["hf"]["tau"] == pytest.approx(1.0)


def test_output_agreement_names_the_pair_that_differs():
    res = {n: {"outputs": [[1, 2, 3]]} for n in ("ar", "ours", "hf", "hf_spec")}
    assert all(output_agreement(res).values())
    res["hf_spec"] = {"outputs": [[1, 2, 4]]}
    assert output_agreement(res) == {"ours_vs_ar": True, "hf_spec_vs_hf": False, "ar_vs_hf": True}


def test_contest_tau_is_pooled_over_the_answers_like_every_table():
    """τ = Σ tokens / Σ steps over the prompts (metrics.TAU), not a mean of per-answer τ: an answer
    of 10 tokens in 2 steps and one of 1 token in 1 step give 11/3, where a mean would say 3."""
    def fake(prompt, max_new):  # prompt = (tokens, steps) this answer takes
        return [0] * prompt[0], 0.5, (prompt[0], prompt[1])

    res = contest(None, [(10, 2), (1, 1)], 16, {"fake": fake}, repeats=2)
    assert res["fake"]["tau"] == 11 / 3
    assert res["fake"]["tok_s"] == 11 / 1.0 and res["fake"]["outputs"] == [[0] * 10, [0]]


def test_bench_names_a_missing_prompt_folder_before_it_measures(tmp_path, monkeypatch):
    """The AR comparison needs MT-Bench prompts, read after minutes of cost-curve timing: a wrong
    --data-dir must fail first, before the target is even loaded."""
    from rich.console import Console

    from harness.core.errors import SpecbenchError
    from harness.runs import bench

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded before the prompt folder was checked")

    monkeypatch.setattr(bench.Target, "load", no_load)
    with pytest.raises(SpecbenchError, match="does not exist"):
        bench.run_bench(target="smollm2-135m", dtype="float32", device="cpu", contexts=[256], sizes=[1, 2],
                        repeats=1, ar_prompts=3, max_new_tokens=8, pld=False, contest_benchmarks=[],
                        contest_prompts=0, data_dir=tmp_path / "missing", out=None, console=Console(quiet=True))
