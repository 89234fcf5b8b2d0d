"""Which backend answers a grid: this process, or Ray with `--ray` (`cli.py compare` / `ablate`).

The caller builds the backend and hands it to harness/runs/executor.py:run_grid, so the executor
never imports the Ray backend (harness/runs/distributed.py), which builds on the executor's `Grid`,
`Sink` and `Runner`: the two import in one direction only.
"""
from __future__ import annotations

from harness.core.errors import SpecbenchError
from harness.runs.executor import Backend, LocalBackend


def make_backend(ray: bool = False, address: str | None = None, pack: bool = False) -> Backend:
    """The local backend, or with `ray` the Ray one at `address` (None: a local Ray), `pack`
    letting untimed CPU cells share a node, one CPU each. Ray not installed: one line, before
    anything loads."""
    if ray:
        from harness.runs.distributed import RayBackend   # imported here: Ray is optional

        return RayBackend(address, pack)
    if pack:
        raise SpecbenchError("--pack packs Ray cells on a node; it needs --ray")
    return LocalBackend()
