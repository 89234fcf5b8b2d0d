"""The held-out split is by prompt: every conversation of one prompt (greedy and sampled answers,
follow-ups that continue it) falls on one side, so held-out scores never see a trained prompt."""
from __future__ import annotations

import json

import torch

from harness.core.paths import REPO_ROOT
from harness.train.data import HOLDOUT_SHARE, FeatureDataset, is_held_out, prompt_key
from harness.train.distill import Conversations, load_distilled, read_prompts
from harness.train.features import _conversations


def fake_shard(convs: list[tuple[list[int], int, int]], hidden: int = 4) -> dict[str, torch.Tensor]:
    """A feature shard of (ids, prompt length, prompt key) conversations, zero features."""
    lengths = torch.tensor([len(c[0]) for c in convs])
    return {"input_ids": torch.tensor([t for c in convs for t in c[0]], dtype=torch.int32),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "prompt_len": torch.tensor([c[1] for c in convs]),
            "prompt_key": torch.tensor([c[2] for c in convs]),
            "hidden": torch.zeros(int(lengths.sum()), hidden, dtype=torch.bfloat16)}


def test_every_conversation_of_a_prompt_falls_on_one_side():
    # 400 prompts x 3 conversations whose opening ids all differ (as a sampled answer or a
    # follow-up's longer prompt makes them differ): split by ids, a prompt would straddle sides.
    g = torch.Generator().manual_seed(0)
    convs, owner = [], []
    for p in range(400):
        key = prompt_key(f"question {p}")
        for _ in range(3):
            n = int(torch.randint(4, 20, (1,), generator=g))
            convs.append((torch.randint(0, 500, (n + 8,), generator=g).tolist(), n, key))
            owner.append(p)
    data = FeatureDataset([fake_shard(convs)], holdout=0.2)
    side = {}
    for seqs, held in ((data.train, False), (data.valid, True)):
        for s in seqs:
            side.setdefault(s.key, set()).add(held)
    assert all(len(v) == 1 for v in side.values()), "a prompt on both sides of the split"
    assert 40 <= len({s.key for s in data.valid}) <= 120  # ~20% of 400 prompts held out
    assert len(data.valid) % 3 == 0 and len(data.train) % 3 == 0


def test_committed_distilled_data_splits_by_first_user_turn():
    """On the committed SmolLM2 folders (base, follow-ups, two sampled): the key of every record
    is its first user turn's, so a follow-up and the sampled answers of a held-out prompt are held
    out with it; the held-out prompts are ~3% of all."""
    prompts_file = REPO_ROOT.parent / "shared" / "data" / "train_prompts" / "prompts.jsonl"
    if not prompts_file.exists():
        import pytest

        pytest.skip(f"{prompts_file} missing: the training prompts come with the benchmark data")
    prompts = read_prompts(prompts_file)
    held, total = set(), set()
    for folder in ("smollm2-135m", "smollm2-135m-followups", "smollm2-135m-seed1-sampled",
                   "smollm2-135m-seed2-sampled"):
        for rec in load_distilled(REPO_ROOT / "datasets" / "distill" / folder):
            key = prompt_key(prompts[rec["prompt_id"]]["prompt"])
            total.add(key)
            if is_held_out(key, HOLDOUT_SHARE):
                held.add(rec["prompt_id"])
    assert 0.015 < len(held) / len(total) < 0.045


def test_feature_extraction_keys_a_follow_up_by_its_first_turn(tmp_path):
    """`_conversations` keys a follow-up record by the first user turn, not by its own prompt."""
    from tests.conftest import make_tiny_target

    target = make_tiny_target()
    target.encode_chat = lambda msgs: [1 + (ord(c) % 90) for m in msgs for c in m["content"]][:40]
    target.decode = lambda ids: "x" * len(ids)
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"id": "p0", "category": "writing", "prompt": "tell me"}) + "\n")
    base = tmp_path / "tiny"
    base.mkdir()
    (base / "manifest.json").write_text(json.dumps({"plan": {}}))
    (base / "shard-00000.jsonl").write_text(json.dumps({"prompt_id": "p0", "sample": 0, "response": "AQACAA=="}) + "\n")
    turn2 = tmp_path / "tiny-followups"
    turn2.mkdir()
    (turn2 / "shard-00000.jsonl").write_text(
        json.dumps({"prompt_id": "p0", "sample": 0, "followup": 0, "response": "AwA="}) + "\n")
    plan = {"base": "tiny", "followups": ["and more?"]}
    convs = Conversations(target, read_prompts(pf), plan, turn2)
    (ids, plen), = _conversations(target, turn2 / "shard-00000.jsonl", convs)[0]
    (key,) = _conversations(target, turn2 / "shard-00000.jsonl", convs)[1]
    assert key == prompt_key("tell me") and plen > len("tell me")
