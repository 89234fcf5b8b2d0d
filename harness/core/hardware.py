"""What machine this is, as far as numbers depend on it: CPU model and the flags that pick the
bf16 matmul kernels, the GPU, and the dtype `auto` chooses from them.

It imports nothing of the harness, so the core (target loading) and the run layer (meta.json,
regression provenance) can both use it. Every decision is a pure function of the flags, so a test
can fake another machine (`cpu_kind`, `auto_dtype` take the flags as an argument).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

# CPU flags that decide bf16 matmul speed on x86 (AMX > AVX512-BF16 > emulation on AVX2).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# Flags whose kernels compute bf16 products natively: a bf16 GEMM's rounding can differ with them.
BF16_KERNEL_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str | None, frozenset[str]]:
    """(model name, flags of the first CPU) from /proc/cpuinfo; (None, empty) off Linux."""
    model, flags = None, frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return model, flags
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and model is None:
            model = value.strip()
        elif name in ("flags", "Features") and not flags:  # "Features" on ARM
            flags = frozenset(value.split())
        if model is not None and flags:
            break
    return model, flags


def cpu_model() -> str | None:
    import platform

    return _cpuinfo()[0] or platform.processor() or platform.machine() or None


def cpu_flags() -> dict[str, bool]:
    """The CPU flags that matter for bf16 speed: avx2, avx512f, avx512_bf16, amx_bf16, amx_tile.

    All False where /proc/cpuinfo cannot be read (macOS, Windows): unknown is treated as absent.
    """
    flags = _cpuinfo()[1]
    return {f: f in flags for f in CPU_FLAGS}


def bf16_class(flags: dict[str, bool]) -> str:
    """The bf16 kernel class of a CPU: 'amx', 'avx512-bf16', 'avx512', 'avx2' or 'other'."""
    if flags.get("amx_bf16"):
        return "amx"
    if flags.get("avx512_bf16"):
        return "avx512-bf16"
    if flags.get("avx512f"):
        return "avx512"
    return "avx2" if flags.get("avx2") else "other"


def has_fast_bf16(flags: dict[str, bool] | None = None) -> bool:
    """True when the CPU multiplies bf16 natively (AMX or AVX512-BF16); elsewhere bf16 is emulated
    and usually slower than float32, so `auto` picks float32 there."""
    return bf16_class(cpu_flags() if flags is None else flags) in ("amx", "avx512-bf16")


def cpu_kind(model: str | None = None, flags: dict[str, bool] | None = None) -> str:
    """A short human name for the machine class figures were measured on, e.g.
    'AMD EPYC (AVX512-BF16, no AMX)' or 'Intel Xeon Platinum 8488C (AMX-BF16)'."""
    model = cpu_model() if model is None else model
    flags = cpu_flags() if flags is None else flags
    label = {"amx": "AMX-BF16", "avx512-bf16": "AVX512-BF16, no AMX", "avx512": "AVX-512, no bf16 kernels",
             "avx2": "AVX2 only", "other": "no x86 SIMD flags"}[bf16_class(flags)]
    return f"{model or 'unknown CPU'} ({label})"


def auto_dtype(device_type: str, flags: dict[str, bool] | None = None, cuda_bf16: bool | None = None) -> str:
    """The dtype `--dtype auto` picks: on a GPU bf16 (float16 where bf16 is unsupported); on a CPU
    bf16 where AMX or AVX512-BF16 exists (a 32-token verify costs ~1.3x a 1-token step on Sapphire
    Rapids, 1.6x on an AMD EPYC with AVX512-BF16, against 2.2x in float32), else float32."""
    if device_type == "cuda":
        if cuda_bf16 is None:
            import torch

            cuda_bf16 = torch.cuda.is_bf16_supported()
        return "bfloat16" if cuda_bf16 else "float16"
    return "bfloat16" if has_fast_bf16(flags) else "float32"
