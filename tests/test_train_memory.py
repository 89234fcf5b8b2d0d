"""The trainer's memory upkeep: heap trims where glibc has them, resident memory in the log."""
from __future__ import annotations

import json
import sys

import pytest

from harness.train.memory import release_free_heap, resident_gib

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and glibc are Linux's")


@linux
def test_trim_and_resident_size_work_on_linux() -> None:
    before = resident_gib()
    assert before is not None and 0.01 < before < 1024
    assert release_free_heap() is True  # glibc: musl-based Linux would need this relaxed


def test_the_trimmer_trims_only_after_the_set_growth(monkeypatch) -> None:
    from harness.train import memory

    sizes = iter([10.0, 12.0, 14.5, 11.0, 13.0, 15.2, 10.5, 9.0])  # resident GiB, one per read
    trims = []
    monkeypatch.setattr(memory, "resident_gib", lambda: next(sizes))
    monkeypatch.setattr(memory, "release_free_heap", lambda: trims.append(1) or True)
    heap = memory.HeapTrimmer(growth_gib=4.0)  # floor 10
    assert heap.after_step() == 12.0 and not trims
    assert heap.after_step() == 14.5 and len(trims) == 1 and heap.floor == 11.0  # grew > 4: trimmed, new floor
    assert heap.after_step() == 13.0 and len(trims) == 1
    assert heap.after_step() == 15.2 and len(trims) == 2 and heap.floor == 10.5
    heap.trim()  # after an evaluation or a checkpoint: trims whatever the growth, new floor
    assert len(trims) == 3 and heap.floor == 9.0
    monkeypatch.setattr(memory, "resident_gib", lambda: None)  # off Linux: never trims
    assert memory.HeapTrimmer(4.0).after_step() is None and len(trims) == 3


@linux
def test_every_log_row_says_the_resident_memory(tiny_target, tmp_path) -> None:
    from methods.medusa import Medusa
    from tests.train_helpers import tiny_dataset, train_quickly

    train_quickly(Medusa(tiny_target), tiny_dataset(tiny_target, n=32, new_tokens=16), tmp_path, steps=12)
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(0.01 < row["rss_gib"] < 1024 for row in rows)


def test_a_dropped_trainer_frees_its_dataset_without_a_garbage_collection(tiny_target, tmp_path) -> None:
    """No reference cycle through the trainer: a script that trains and then decodes in one process
    (data_curve, eagle3_parts, ablate) gets the features' memory back when training returns."""
    import gc
    import weakref

    from harness.train.trainer import TrainConfig, Trainer
    from methods.medusa import Medusa
    from tests.train_helpers import tiny_dataset

    data = tiny_dataset(tiny_target, n=32, new_tokens=16)
    cfg = TrainConfig(steps=3, warmup=1, tokens_per_batch=512, max_len=64, eval_batches=1, autocast="off")
    gc.disable()
    try:
        trainer = Trainer(Medusa(tiny_target), data, cfg, tmp_path)
        trainer.train()
        alive = weakref.ref(trainer)
        del trainer
        assert alive() is None
    finally:
        gc.enable()
