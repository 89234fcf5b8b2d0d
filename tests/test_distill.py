"""Self-distillation data: single-turn plans and follow-up (second-turn) plans, through feature
extraction, on the tiny Llama with a byte-level 'chat' encoding (no tokenizer, seconds)."""
from __future__ import annotations

import json

import pytest

from harness.core.errors import SpecbenchError
from harness.core.paths import REPO_ROOT
from harness.train.distill import DistillPlan, distill, load_distilled, read_followups
from harness.train.features import extract_features, load_feature_shards


@pytest.fixture
def chat_target():
    from tests.conftest import make_tiny_target

    target = make_tiny_target()

    def encode_chat(messages):  # role marker + bytes; long enough to hold a first answer
        return [t for m in messages for t in [91 if m["role"] == "user" else 92]
                + [b % 90 + 1 for b in m["content"].encode()]][:120]

    target.encode_chat = encode_chat
    target.decode = lambda ids: "".join(chr(97 + i % 26) for i in ids)
    return target


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "category": "writing", "prompt": f"tell me about thing {i}"}) + "\n"
                            for i in range(6)))
    return path


def test_single_turn_then_follow_ups_give_multi_turn_training_conversations(chat_target, prompt_file, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    base = tmp_path / "distill" / "tiny"
    plan = DistillPlan(str(prompt_file), samples=1, max_new_tokens=6, shard_size=4)
    assert distill(chat_target, prompt_file, base, plan, batch_size=4)["generated_now"] == 2
    first = {r["prompt_id"]: r["response_ids"] for r in load_distilled(base)}
    assert len(first) == 6 and all(len(ids) == 6 for ids in first.values())

    followups = read_followups(REPO_ROOT / "datasets" / "followups.jsonl")
    turn2 = tmp_path / "distill" / "tiny-followups"
    fplan = DistillPlan(str(prompt_file), n=4, samples=1, max_new_tokens=5, max_prompt_tokens=120, shard_size=3,
                        base="tiny", followups=followups)
    assert distill(chat_target, prompt_file, turn2, fplan, batch_size=4)["generated_now"] == 2
    recs = load_distilled(turn2)
    assert len(recs) == 4 and all(0 <= r["followup"] < len(followups) for r in recs)
    manifest = json.loads((turn2 / "manifest.json").read_text())
    assert manifest["plan"]["base"] == "tiny" and manifest["plan"]["followups"] == list(followups)
    # resumable: nothing left to do, same plan hash
    assert distill(chat_target, prompt_file, turn2, fplan, batch_size=4)["generated_now"] == 0

    # Features: the conversation is prompt, first answer, follow-up, second answer; only the
    # second answer is a training target.
    shards = load_feature_shards(extract_features(chat_target, turn2, prompt_file))
    rec = sorted(recs, key=lambda r: r["prompt_id"])
    got = {}
    for shard in shards:
        off = shard["offsets"].tolist()
        for i in range(len(off) - 1):
            ids = shard["input_ids"][off[i]: off[i + 1]].tolist()
            got[tuple(ids)] = int(shard["prompt_len"][i])
    for r in rec:
        prompt = chat_target.encode_chat([
            {"role": "user", "content": f"tell me about thing {r['prompt_id'][1:]}"},
            {"role": "assistant", "content": chat_target.decode(first[r["prompt_id"]])},
            {"role": "user", "content": followups[r["followup"]]}])
        assert got[tuple(prompt + r["response_ids"])] == len(prompt)


def test_follow_up_file_errors_are_one_line(tmp_path):
    with pytest.raises(SpecbenchError, match="not found"):
        read_followups(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "oops"}\n')
    with pytest.raises(SpecbenchError, match=r"bad.jsonl:2: malformed follow-up"):
        read_followups(bad)


def test_token_ids_past_uint16_are_stored_with_four_bytes():
    # Qwen2.5's vocabulary has 151,936 ids: 2-byte storage would wrap them silently.
    from harness.train.distill import decode_ids, encode_ids, id_bytes, record_ids

    assert id_bytes(49_152) == 2 and id_bytes(151_936) == 4
    ids = [0, 65_535, 65_536, 151_643]
    assert decode_ids(encode_ids(ids, 4), 4) == ids
    assert record_ids({"response": encode_ids(ids, 4), "id_bytes": 4}) == ids
    assert record_ids({"response": encode_ids([5, 65_535])}) == [5, 65_535]  # records without the key: 2 bytes
    with pytest.raises(SpecbenchError, match="uint16"):
        encode_ids(ids, 2)


def test_more_data_for_the_same_prompts_is_a_sampled_only_plan_with_another_seed(chat_target, prompt_file, tmp_path):
    first = DistillPlan(str(prompt_file), samples=2, max_new_tokens=4, shard_size=6)
    more = DistillPlan(str(prompt_file), samples=3, greedy=False, seed=1, max_new_tokens=4, shard_size=6)
    # the committed folders' plan hashes cover settings without the new key
    assert "greedy" not in first.settings() and more.settings()["greedy"] is False
    distill(chat_target, prompt_file, tmp_path / "a", first, batch_size=6)
    distill(chat_target, prompt_file, tmp_path / "b", more, batch_size=6)
    a, b = load_distilled(tmp_path / "a"), load_distilled(tmp_path / "b")
    assert sorted(r["sample"] for r in a) == [0] * 6 + [1] * 6
    assert sorted(r["sample"] for r in b) == [1] * 6 + [2] * 6
    assert all(r["temperature"] == 0.8 and r["seed"] is not None for r in b)
    seeds_a = {r["seed"] for r in a if r["sample"]}
    assert seeds_a.isdisjoint(r["seed"] for r in b)


def test_a_sampled_only_plan_with_one_sample_is_refused():
    from typer.testing import CliRunner

    from cli import app

    with pytest.raises(SpecbenchError, match="samples >= 2"):
        DistillPlan("p.jsonl", samples=1, greedy=False)
    res = CliRunner().invoke(app, ["distill", "--prompts", "p.jsonl", "--samples", "1", "--no-greedy"])
    assert res.exit_code == 2 and "--samples 2" in res.output
