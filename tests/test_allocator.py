"""The glibc allocator tuning every CLI command applies."""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from harness.core import allocator


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or not ctypes.util.find_library("c"),
                    reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds():
    assert allocator.keep_freed_memory() is True


def test_values_beyond_a_c_int_are_refused():
    assert allocator.keep_freed_memory(1 << 31) is False


def test_no_c_library_is_not_an_error(monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("no libc here")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert allocator.keep_freed_memory() is False
