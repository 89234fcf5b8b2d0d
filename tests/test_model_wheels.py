"""Targets shipped as chunk wheels: the parts are found without importing them, assembled in
order, checked against the SHA-256, and every failure is one line naming the install command."""
from __future__ import annotations

import hashlib
import sys

import pytest

from harness.core import model_wheels
from harness.core.errors import SpecbenchError
from harness.core.model_wheels import WheelModel, gguf_path


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three importable chunk packages `fakechunk_partN/data/partNN.bin` (as the real wheels lay them out)."""
    site = tmp_path / "site"
    chunks = [bytes([i]) * (1000 + i) for i in range(1, 4)]
    for i, data in enumerate(chunks, start=1):
        pkg = site / f"fakechunk_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('chunk packages must never be imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(chunks)
    model = WheelModel(tuple(f"fakechunk_part{i}" for i in range(1, 4)), "fake.gguf",
                       hashlib.sha256(whole).hexdigest(), len(whole), "pip install fakechunk-part1..3")
    monkeypatch.setitem(model_wheels.WHEEL_MODELS, "fake-model", model)
    return whole


def test_parts_are_assembled_in_order_once(fake_parts, tmp_path):
    out = gguf_path("fake-model", tmp_path / "cache")
    assert out.read_bytes() == fake_parts
    assert not any(m.startswith("fakechunk_part") for m in sys.modules)  # found, never imported
    mtime = out.stat().st_mtime_ns
    assert gguf_path("fake-model", tmp_path / "cache").stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_a_wrong_checksum_is_refused_and_leaves_nothing(fake_parts, tmp_path, monkeypatch):
    m = model_wheels.WHEEL_MODELS["fake-model"]
    monkeypatch.setitem(model_wheels.WHEEL_MODELS, "fake-model", WheelModel(m.modules, m.file, "0" * 64, m.size, m.install))
    with pytest.raises(SpecbenchError, match="reinstall them with: pip install fakechunk"):
        gguf_path("fake-model", tmp_path / "cache")
    assert not list((tmp_path / "cache" / "gguf").iterdir())


def test_a_missing_part_names_the_install_command(fake_parts, tmp_path, monkeypatch):
    m = model_wheels.WHEEL_MODELS["fake-model"]
    modules = m.modules + ("fakechunk_part_absent",)
    monkeypatch.setitem(model_wheels.WHEEL_MODELS, "fake-model", WheelModel(modules, m.file, m.sha256, m.size, m.install))
    with pytest.raises(SpecbenchError, match="'fakechunk_part_absent' is not installed; install with: pip install"):
        gguf_path("fake-model", tmp_path / "cache")


def test_the_qwen_pair_is_known_with_its_checksums():
    for alias, parts in (("qwen2.5-coder-1.5b", 22), ("qwen2.5-coder-0.5b", 6)):
        m = model_wheels.WHEEL_MODELS[alias]
        assert len(m.modules) == parts and len(m.sha256) == 64 and m.size > 4e8
        assert m.install.count("==") == parts
