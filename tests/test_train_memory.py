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


@linux
def test_every_log_row_says_the_resident_memory(tiny_target, tmp_path) -> None:
    from methods.medusa import Medusa
    from tests.train_helpers import tiny_dataset, train_quickly

    train_quickly(Medusa(tiny_target), tiny_dataset(tiny_target, n=32, new_tokens=16), tmp_path, steps=12)
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(0.01 < row["rss_gib"] < 1024 for row in rows)
