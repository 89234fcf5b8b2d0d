"""The data curve's parts: nested train shares over a fixed held-out split, feature shards reused
from a folder that holds more layers, and the curve's table and plot."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from harness.train.data import FeatureDataset
from harness.train.features import covering_dir, feature_dir, load_feature_shards


def synthetic_shard(n_convs: int = 400, hidden: int = 8, layers: tuple[int, ...] = (), seed: int = 0) -> dict:
    """A feature shard of `n_convs` random conversations of 6-20 tokens (3 prompt tokens each)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 21, (n_convs,), generator=g)
    total = int(lengths.sum())
    shard = {"input_ids": torch.randint(0, 1000, (total,), generator=g, dtype=torch.int32),
             "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
             "prompt_len": torch.full((n_convs,), 3, dtype=torch.long),
             "hidden": torch.randn(total, hidden, generator=g).to(torch.bfloat16)}
    for i in layers:
        shard[f"layer_{i}"] = torch.randn(total, hidden, generator=g).to(torch.bfloat16)
    return shard


def opening(seq) -> tuple[int, ...]:
    return tuple(seq.ids[:8].tolist())


def test_train_shares_nest_and_keep_the_held_out_split() -> None:
    shard = synthetic_shard()
    full, half, quarter = (FeatureDataset([shard], train_share=s) for s in (1.0, 0.5, 0.25))
    assert [opening(s) for s in full.valid] == [opening(s) for s in half.valid] == [opening(s) for s in quarter.valid]
    assert {opening(s) for s in quarter.train} < {opening(s) for s in half.train} < {opening(s) for s in full.train}
    assert 0.15 < len(quarter.train) / len(full.train) < 0.35
    assert 0.38 < len(half.train) / len(full.train) < 0.62


class FakeTarget:
    name = "fake"
    dtype = torch.bfloat16


def test_shards_with_more_layers_serve_a_request_for_fewer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    manifest = {"plan_hash": "abc123"}
    wide = feature_dir(FakeTarget(), tmp_path, manifest, [2, 5, 7])
    wide.mkdir(parents=True)
    save_file(synthetic_shard(20, layers=(2, 5, 7)), str(wide / "shard-00000.safetensors"))
    # no folder of its own: the three-layer folder serves the last-layer request and a subset request
    assert covering_dir(FakeTarget(), tmp_path, manifest, None, ["shard-00000"]) == wide
    assert covering_dir(FakeTarget(), tmp_path, manifest, [5], ["shard-00000"]) == wide
    assert covering_dir(FakeTarget(), tmp_path, manifest, [3], ["shard-00000"]) is None
    assert covering_dir(FakeTarget(), tmp_path, manifest, None, ["shard-00000", "shard-00001"]) is None
    # another dtype never serves
    other = wide.parent / "abc123-float32"
    other.mkdir()
    save_file(synthetic_shard(20), str(other / "shard-00001.safetensors"))
    assert covering_dir(FakeTarget(), tmp_path, manifest, None, ["shard-00001"]) is None
    # only the keys asked for are loaded
    loaded = load_feature_shards(wide, layers=[5])[0]
    assert sorted(loaded) == ["hidden", "input_ids", "layer_5", "offsets", "prompt_len"]


def test_curve_table_and_plot(tmp_path: Path) -> None:
    from harness.report.data_curve import write_curve

    rows = [{"method": "eagle", "decoded_as": "eagle2", "train_share": s, "train_tokens": int(971687 * s),
             "steps": int(1500 * s), "held_out_top1": top1, "held_out_top1_step2": None, "tau": tau,
             "answers": 20, "mismatches": 0, "checkpoint": "c", "run": "r"}
            for s, top1, tau in [(1.0, 0.549, 2.06), (0.25, 0.50, 1.90)]]
    frame = write_curve(rows, tmp_path, {"benchmark": "mt_bench", "limit": 10, "steps": 1500, "dtype": "float32",
                                         "tree_budget": "24", "max_new_tokens": 128, "target": "smollm2-135m"})
    assert frame["train_share"].tolist() == [0.25, 1.0]
    table = (tmp_path / "curve.md").read_text()
    assert "| EAGLE | EAGLE-2 | 0.25 | 242,921 | 375 | 0.500 |  | 1.90 | 20 (0) |" in table
    assert (tmp_path / "curve.png").stat().st_size > 10_000
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["settings"]["steps"] == 1500 and "cpu_kind" in meta["machine"]
    with pytest.raises(KeyError):
        meta["settings"]["out"]


def test_dataset_keeps_its_own_copies_and_reads_a_generator() -> None:
    """Shards given one at a time (a generator) split as a list does, and no kept conversation
    holds a view of its shard: what a share leaves out is freed with the shard."""
    shards = [synthetic_shard(60, layers=(2, 5), seed=s) for s in (1, 2)]
    as_list = FeatureDataset(shards, layers=[2, 5], train_share=0.5)
    as_gen = FeatureDataset(iter(shards), layers=[2, 5], train_share=0.5)
    assert [opening(s) for s in as_list.train] == [opening(s) for s in as_gen.train]
    assert [opening(s) for s in as_list.valid] == [opening(s) for s in as_gen.valid]
    first = as_list.train[0]
    n = len(first.ids)
    assert first.layers.shape == (n, 16)  # layer 2 then layer 5, side by side
    shard_ptrs = {t.untyped_storage().data_ptr() for sh in shards for t in sh.values()}
    for seq in as_list.train + as_list.valid:
        assert seq.hidden.untyped_storage().data_ptr() not in shard_ptrs
        assert seq.layers.untyped_storage().data_ptr() not in shard_ptrs
    row = next(i for i in range(60) if opening_of(shards[0], i) == opening(first))
    a = int(shards[0]["offsets"][row])
    assert torch.equal(first.layers[:, 8:], shards[0]["layer_5"][a : a + n])
    assert torch.equal(first.hidden, shards[0]["hidden"][a : a + n])


def opening_of(shard: dict, i: int) -> tuple[int, ...]:
    a = int(shard["offsets"][i])
    return tuple(shard["input_ids"][a : a + 8].long().tolist())
