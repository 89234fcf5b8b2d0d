"""End-to-end checks on the real SmolLM2-135M target (float32, so greedy is exact)."""
from __future__ import annotations

import json

import pytest
import torch

from harness.core.decode import GenerationConfig, generate
from harness.core.tree import tree_from_parent_map
from harness.runs.benchmarks import load_questions
from harness.runs.config import RunConfig
from harness.runs.executor import run_grid, summarize_dir
from harness.runs.results import RunDir
from harness.testing.oracle import OracleDrafter
from methods.pld import PromptLookupDrafter
from tests.train_helpers import assert_tree_logits_match_paths


def chat_prompts(target, data, per_bench: int = 2) -> list[list[int]]:
    out = []
    for bench in ("mt_bench", "humaneval", "gsm8k"):
        for q in load_questions(bench, data, limit=per_bench):
            out.append(target.encode_chat([{"role": "user", "content": q.turns[0]}]))
    return out


def test_tree_logits_equal_path_forwards(smollm2_fp32):
    t = smollm2_fp32
    prefix = torch.tensor(t.encode_chat([{"role": "user", "content": "Name three colours."}]))
    tree = tree_from_parent_map(int(prefix[-1]), [504, 3458, 28, 314, 2116, 30], [0, 0, 1, 1, 2, 5])
    assert_tree_logits_match_paths(t, prefix[:-1], tree)


@pytest.mark.slow
def test_pld_and_oracle_reproduce_ar(smollm2_fp32, shared_data):
    t = smollm2_fp32
    cfg = GenerationConfig(max_new_tokens=32)
    accepted = []
    for i, p in enumerate(chat_prompts(t, shared_data)):
        ar = generate(t, p, cfg)
        for d in (PromptLookupDrafter(t), OracleDrafter(t, {"continuation": ar.output_ids, "prompt_len": len(p),
                                                              "seed": i})):
            sp = generate(t, p, cfg, d)
            assert sp.output_ids == ar.output_ids, f"prompt {i}: {d.name} diverged"
            if d.name == "oracle":
                accepted += sp.accepted
    assert sum(a > 0 for a in accepted) / len(accepted) >= 0.3


def _run(target, data, out, limit=2):
    cfg = RunConfig(methods=["pld"], benchmarks=["mt_bench"], target="smollm2-135m", dtype="float32",
                    limit=limit, max_new_tokens=8)
    return run_grid(cfg, out, data, target=target)


@pytest.mark.slow
def test_run_writes_records_summary_and_resumes(smollm2_fp32, shared_data, tmp_path, monkeypatch):
    _run(smollm2_fp32, shared_data, tmp_path / "full")
    ref = RunDir(tmp_path / "full").records()
    assert len(ref) == 2 * 2 * 2  # 2 questions x 2 turns x (ar, pld)
    summary = summarize_dir(tmp_path / "full")
    pld = summary[summary.method == "pld"].iloc[0]
    assert pld.mismatches == 0 and pld.tau >= 1.0
    meta = json.loads((tmp_path / "full" / "meta.json").read_text())
    assert meta["config"]["methods"] == ["pld"] and "cpu_flags" in meta

    # Kill the run after 3 records, then start it again.
    calls = {"n": 0}
    real_append = RunDir.append

    def dying_append(self, rec):
        if calls["n"] == 3:
            raise KeyboardInterrupt
        calls["n"] += 1
        real_append(self, rec)

    monkeypatch.setattr(RunDir, "append", dying_append)
    with pytest.raises(KeyboardInterrupt):
        _run(smollm2_fp32, shared_data, tmp_path / "killed")
    monkeypatch.setattr(RunDir, "append", real_append)
    first = (tmp_path / "killed" / "records.jsonl").read_bytes()
    _run(smollm2_fp32, shared_data, tmp_path / "killed")
    after = (tmp_path / "killed" / "records.jsonl").read_bytes()
    assert after.startswith(first), "finished records must stay byte-identical"
    resumed = RunDir(tmp_path / "killed").records()
    keys = [r["key"] for r in resumed]
    assert len(keys) == len(set(keys)), "no record may be duplicated"
    assert sorted(keys) == sorted(r["key"] for r in ref)
    by_key = {r["key"]: r["output_ids"] for r in ref}
    assert all(by_key[r["key"]] == r["output_ids"] for r in resumed)


def test_run_refuses_a_dir_with_another_config(smollm2_fp32, shared_data, tmp_path):
    from harness.core.errors import SpecbenchError

    _run(smollm2_fp32, shared_data, tmp_path / "r", limit=1)
    with pytest.raises(SpecbenchError, match="another config"):
        _run(smollm2_fp32, shared_data, tmp_path / "r", limit=2)
