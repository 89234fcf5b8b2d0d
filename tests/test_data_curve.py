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
             "prompt_key": torch.randint(-2**62, 2**62, (n_convs,), generator=g),
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
    held_out_only = FeatureDataset([shard], train_share=0.0)
    assert held_out_only.train == [] and [opening(s) for s in held_out_only.valid] == [opening(s) for s in full.valid]


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
    assert sorted(loaded) == ["hidden", "input_ids", "layer_5", "offsets", "prompt_key", "prompt_len"]


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
    assert "equal passes over its data)." in table and "share above 1" not in table
    grown = {**rows[0], "train_share": 1.51, "train_tokens": 1471932, "steps": 2300}
    write_curve(rows + [grown], tmp_path, {"steps": 1500})
    assert "a share above 1 trains on more distilled folders" in (tmp_path / "curve.md").read_text()
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


def test_a_checkpoint_is_evaluated_as_its_training_evaluated_it(tiny_target, tmp_path: Path, monkeypatch) -> None:
    """evaluate_checkpoint reads saved weights on the held-out split of the data it is given
    (loading no training conversations) with the batches and autocast of the checkpoint's own
    training: it gets the trainer's held-out metrics of the weights as stored (bf16)."""
    from harness.train import pipeline
    from harness.train.trainer import TrainConfig, Trainer, held_out_metrics
    from methods.common.checkpoint_io import read_weights
    from methods.eagle import Eagle
    from tests.train_helpers import tiny_dataset

    data = tiny_dataset(tiny_target, n=48, new_tokens=24)
    cfg = TrainConfig(steps=30, lr=3e-3, warmup=5, tokens_per_batch=512, max_len=64, save_every=10_000,
                      eval_every=10_000, eval_batches=4, autocast="off")
    drafter = Eagle(tiny_target)
    trained = Trainer(drafter, data, cfg, tmp_path / "ck").train()
    drafter.load_state_strictly(read_weights(tmp_path / "ck" / "model.safetensors"), tmp_path)
    as_stored = held_out_metrics(drafter, data.valid, cfg, bf16=False)
    asked = []

    def held_out_split(target, folders, prompts, console, shards, layers, train_share):
        asked.append((folders, train_share))
        return data

    monkeypatch.setattr(pipeline, "load_dataset", held_out_split)
    got = pipeline.evaluate_checkpoint(tiny_target, "eagle", tmp_path / "ck", [Path("some/folder")])
    assert asked == [([Path("some/folder")], 0.0)]
    assert set(got) == {k for k in trained if k.startswith("val_")}
    for k, v in got.items():
        assert abs(v - as_stored[k]) < 1e-6, k  # the same computation on the same values
        # the trainer's own figure used the float32 master weights: bf16 storage moves a loss by ~1e-4
        assert abs(v - trained[k]) < 2e-3 * max(1.0, abs(trained[k])) or k == "val_acc", k
    with pytest.raises(Exception, match="no config.json"):
        pipeline.evaluate_checkpoint(tiny_target, "eagle", tmp_path / "nothing", None)


def test_held_out_of_a_point_comes_from_its_log_or_one_evaluation_on_the_base_split(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """A point trained on the base folders reads its log's last evaluation; one trained on more
    data is evaluated once on the base split (held_out.json), then read from that file."""
    from harness.train import pipeline
    from scripts import data_curve

    def checkpoint(name: str, folders: list[str]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"training": {"data": [{"folder": f} for f in folders]}}))
        (folder / "train_log.jsonl").write_text('{"step": 100, "val_acc": 0.4}\n{"step": 150, "acc": 0.6}\n'
                                                '{"step": 200, "val_acc": 0.5}\n')
        return folder

    base = ["datasets/distill/smollm2-135m", "datasets/distill/smollm2-135m-followups"]
    calls = []
    monkeypatch.setattr(pipeline, "evaluate_checkpoint",
                        lambda target, method, folder, data: calls.append((method, data)) or {"val_acc": 0.55})
    no_target = lambda: pytest.fail("a point trained on the base folders needs no target")  # noqa: E731
    assert data_curve.point_held_out("eagle", checkpoint("base", base), "smollm2-135m", no_target)["val_acc"] == 0.5
    grown = checkpoint("grown", base + ["datasets/distill/smollm2-135m-seed1-sampled"])
    assert data_curve.point_held_out("eagle", grown, "smollm2-135m", lambda: "target") == {"val_acc": 0.55}
    assert [(m, [data_curve.repo_path(f) for f in d]) for m, d in calls] == [("eagle", base)]
    saved = json.loads((grown / "held_out.json").read_text())
    assert saved["data"] == base and saved["metrics"] == {"val_acc": 0.55} and "commit" in saved["made_by"]
    assert data_curve.point_held_out("eagle", grown, "smollm2-135m", no_target) == {"val_acc": 0.55}
    assert len(calls) == 1
