"""Which code and machine a number came from: commit and dirty state of the checkout, package
versions, threads, CPU kind and flags, GPU, memory, load. Run folders store it in meta.json,
trained weights per training session, benchmarks and profiles beside their figures."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.core.hardware import cpu_flags, cpu_kind, cpu_model

# Packages whose versions change numbers (kernels, cache internals, quantisation readers).
META_PACKAGES = ("torch", "transformers", "accelerate", "gguf", "pandas", "numpy", "specbench")
# Cores' worth of CPU other processes may use while a run times itself before its seconds count as
# contended: an idle machine shows ~0.01, and a quarter of a core elsewhere already moves CPU
# timings by several percent. One threshold for the run-start check and the cost curve's cache.
CONTENDED_CORES = 0.25


def _git(args: list[str], cwd: Path) -> str | None:
    """stdout of a git command, or None when git is missing, slow, or this is not a checkout."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout holding this file; (None, None) outside a git checkout."""
    here = Path(__file__).resolve().parent
    commit = _git(["rev-parse", "HEAD"], here)
    if commit is None:
        return None, None
    status = _git(["status", "--porcelain"], here)
    return commit.strip(), (None if status is None else bool(status.strip()))


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in META_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):
        return None


def _load_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return None


def _torch_state() -> tuple[int | None, str | None, int]:
    """(torch threads, name of GPU 0 or None, GPU count); all empty when torch is missing."""
    try:
        import torch
    except Exception:  # a broken torch install must not stop metadata collection
        return None, None, 0
    threads = torch.get_num_threads()
    try:
        if torch.cuda.is_available():
            return threads, torch.cuda.get_device_name(0), torch.cuda.device_count()
    except Exception:  # driver errors: report no GPU rather than fail the run
        pass
    return threads, None, 0


def collect_meta() -> dict[str, Any]:
    """Software and machine state for meta.json. Never raises: anything unknown is null.

    Keys: commit, dirty, date, python, packages, torch_threads, platform, cpu_model, cpu_kind, cpu_flags,
    logical_cores, memory_gib, gpu, gpu_count, load_avg_1m, hostname.
    """
    commit, dirty = git_state()
    threads, gpu, gpu_count = _torch_state()
    return {
        "commit": commit,
        "dirty": dirty,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "packages": _package_versions(),
        "torch_threads": threads,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_kind": cpu_kind(),
        "cpu_flags": cpu_flags(),
        "logical_cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpu": gpu,
        "gpu_count": gpu_count,
        "load_avg_1m": _load_1m(),
        "hostname": socket.gethostname(),
    }


class OtherCpuUse:
    """Context manager: how many cores' worth of CPU time other processes used while its block
    ran (`cores`, None where /proc/stat is missing). The machine's busy time from /proc/stat minus
    this process's own CPU time, over the wall time: unlike the load average it does not count
    this process's own earlier work, so a run can ask it in the middle of its measurement."""

    def __enter__(self) -> "OtherCpuUse":
        # Imported here, not at the top: run folders and reports read this module's machine facts
        # without loading torch (which the clock synchronises CUDA with).
        from harness.core import timing

        self.cores: float | None = None
        # host CPU time over host wall time: the clock waits for no device
        self._start = (_busy_seconds(), _own_cpu_seconds(), timing.now())
        return self

    def __exit__(self, *exc) -> None:
        from harness.core import timing

        busy0, own0, wall0 = self._start
        busy1, own1, wall1 = _busy_seconds(), _own_cpu_seconds(), timing.now()
        if busy0 is not None and busy1 is not None and wall1 > wall0:
            self.cores = max(0.0, ((busy1 - busy0) - (own1 - own0)) / (wall1 - wall0))


def _busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux: /proc/stat's first line)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def contention_warning(cores: int | None = None, sample_s: float = 0.5) -> str | None:
    """A warning when other processes compete for the CPU right now, else None.

    Samples OtherCpuUse for `sample_s` seconds (the same measure each answer and the cost curve
    record), so unlike the load average it is not raised by a run that has just finished or by
    this process's own work. `cores`: the logical cores the run will use (default all); cores it
    leaves free absorb other work. None where /proc/stat is missing (no check there).
    """
    logical = os.cpu_count() or 1
    used = logical if cores is None else max(1, min(cores, logical))
    with OtherCpuUse() as others:
        time.sleep(sample_s)
    threshold = CONTENDED_CORES + (logical - used)
    if others.cores is None or others.cores <= threshold:
        return None
    return (
        f"other processes are using {others.cores:.2f} cores' worth of CPU (a run on {used} of "
        f"{logical} cores tolerates {threshold:.2f}): seconds and speedups will be noisy; wait for them to finish"
    )
