"""Sweeps on Ray (`compare` / `ablate --ray [ADDRESS]`): a grid's cells as Ray tasks, written into
the same resumable run folder as a single-process run. Ray is optional (`pip install ray`).

A cell is one slot (AR, a method or one of its variants, at one temperature and rule) on one
benchmark: its questions and turns in order, since a second turn continues the slot's own first
answer. Each task loads the target and builds its one drafter in the worker, warms it up,
answers the cell's missing records (`Runner.cell` and `Runner.answer`, as the local backend
answers) and returns them. `RayBackend` is the executor's second backend: the run folder, resume,
progress and meta.json are the executor's (harness/runs/executor.py), as for a local run. The
driver never loads a model and is the one writer: it appends what comes back, skipping keys
already in the file, so a worker killed mid-cell (Ray retries its task) loses only that cell's
unfinished work and duplicates nothing.

Resources: a timed cell asks for a whole device (one GPU for a GPU target, else every CPU of a
node), so no two timed cells ever run side by side; with `pack` (τ and outputs only, e.g. a
float32 exactness sweep) a CPU cell asks for one CPU and runs one thread, so cells pack.
Every record says which node answered it (`worker`), since speedups are ratios within a node.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.runs.benchmarks import Question
from harness.runs.config import RunConfig
from harness.runs.executor import Grid, Runner, Sink
from harness.runs.record import AR_METHOD, Record
from harness.runs.slots import MethodSlot, build_slots, load_target, method_classes, resolved_methods

# Set by tests only (in the driver's environment, passed to the tasks): a worker that answers the
# first record of a cell while this file is absent creates it and dies (os._exit), as a killed
# machine would; Ray then retries the cell.
FAIL_ONCE_ENV = "SPECBENCH_RAY_FAIL_ONCE"
TASK_RETRIES = 3


def ray_module():
    try:
        import ray
    except ImportError:
        raise SpecbenchError("--ray needs Ray: pip install 'ray>=2.40' (an optional dependency)") from None
    return ray


@dataclass(frozen=True)
class Cell:
    """One task: slot `label` (AR, a method, or a variant) of run `run` (an index into
    `RunConfig.runs()`) on `benchmark`."""

    run: int
    method: str          # "ar" or a method name
    label: str           # the variant label ("" for a plain method)
    benchmark: str


@dataclass(frozen=True)
class GridRef:
    """What every task needs beside its config: the ablation variants, and the driver's working
    directory (a relative target path or checkpoint folder resolves there)."""

    variants: dict | None
    cwd: str


def _worker_target(cfg: RunConfig, grid: GridRef, threads: int | None):
    """In a worker: the driver's working directory and heap settings, `threads` torch threads,
    and the worker's own copy of the target."""
    import torch

    from harness.core.allocator import keep_freed_memory

    keep_freed_memory()  # the CLI's heap settings, so a worker's timings compare with a local run's
    if os.path.isdir(grid.cwd):  # a node of a cluster may not have the driver's folder
        os.chdir(grid.cwd)
    if threads:
        torch.set_num_threads(threads)
    return load_target(cfg, Console(stderr=True, quiet=True))


def resolve_task(cfg: RunConfig, grid: GridRef) -> dict[str, Any]:
    """In a worker: build every slot once, for meta.json's `methods_resolved`, the slots' hashes
    and the target runtime the cells run on."""
    target = _worker_target(cfg, grid, None)
    slots = build_slots(target, method_classes(cfg.methods), cfg, grid.variants)
    return {"methods_resolved": resolved_methods(slots), "target_runtime": target.runtime_name,
            "slots": [(s.name, s.label, s.config_hash, s.drafter is None) for s in slots]}


def cell_task(cfg: RunConfig, questions: list[Question], grid: GridRef, cell: Cell, existing: dict[str, Record],
              threads: int | None, fail_marker: str | None = None) -> list[Record]:
    """In a worker: answer one cell's missing records (after a warm-up) and return them.
    `cfg`: the cell's run (one temperature and rule); `existing`: the cell's finished records."""
    import torch

    target = _worker_target(cfg, grid, threads)
    classes = method_classes([cell.method])
    mine = {cell.label: grid.variants[cell.label]} if (grid.variants and cell.method != AR_METHOD) else None
    slot = build_slots(target, classes, cfg, mine)[-1]   # AR's slot comes first, the cell's method after it
    runner = Runner(cfg, {cell.benchmark: questions}, target, [slot])
    runner.warm_up()
    node = {"node": socket.gethostname(), "pid": os.getpid(), "threads": torch.get_num_threads()}
    records = []
    for s, q, turn in runner.cell(slot, cell.benchmark):
        rec = runner.answer(s, q, turn, existing)
        if rec is None:
            continue
        rec.extra["worker"] = node  # written after the record's own fields
        records.append(rec)
        if fail_marker and not Path(fail_marker).exists():
            Path(fail_marker).write_text("killed once\n")
            os._exit(1)
    return records


def _resources(cfg: RunConfig, pack: bool, node_cpus: int) -> tuple[dict[str, Any], int | None]:
    """(Ray resource options, torch threads) of one cell."""
    if cfg.device.startswith("cuda"):
        return {"num_gpus": 1, "num_cpus": 1}, None
    if pack:
        return {"num_cpus": 1}, 1
    return {"num_cpus": node_cpus}, node_cpus


class RayBackend:
    """The executor's Ray backend (see the module docstring): the driver never loads a model."""

    answers_here = False

    def __init__(self, address: str | None, pack: bool) -> None:
        self.ray = ray_module()  # not installed: one line, before anything loads
        self.address, self.pack = address, pack
        self.runs: list[RunConfig] = []
        self.cells: list[tuple[Cell, tuple[str, ...]]] = []

    def start(self, grid: Grid) -> tuple[dict[str, Any], str]:
        ray = self.ray
        if not ray.is_initialized():
            # Workers import this project as the driver does (installed with `pip install -e .` on
            # every node of a cluster); without an address Ray starts a local one on this machine.
            ray.init(address=self.address or None, include_dashboard=False, log_to_driver=False)
        self.node_cpus = max(1, int(min(n["Resources"].get("CPU", 1) for n in ray.nodes() if n["Alive"])))
        self.ref = GridRef(grid.variants, os.getcwd())
        with grid.console.status("building the drafters once, in a worker"):
            resolved = ray.get(ray.remote(resolve_task).options(num_cpus=1).remote(grid.cfg, self.ref))
        # The drafters live in the workers: the driver's slots stand in for them (only
        # `drafter is None`, AR, matters to the keys).
        self.slots = [MethodSlot(n, None if is_ar else "in a worker", {}, h, None, lab)
                      for n, lab, h, is_ar in resolved["slots"]]
        self.runs = grid.cfg.runs()
        return resolved["methods_resolved"], resolved["target_runtime"]

    def warm_up(self, grid: Grid) -> None:
        """Each task warms its own drafter up."""

    def plan(self, grid: Grid, existing: dict[str, Record]) -> tuple[str, int]:
        """The cells with an answer missing, each once: AR's answers are keyed without the rule,
        so the runs of one temperature (lossless and typical) share AR's cells."""
        self.cells, seen = [], set()
        for i, run in enumerate(self.runs):
            runner = Runner(run, grid.questions, None, self.slots)
            for slot in self.slots:
                if slot.drafter is not None and slot.name not in run.methods:
                    continue
                for bench in run.benchmarks:
                    keys = tuple(runner.cell_keys(slot, bench))
                    if keys in seen or all(k in existing for k in keys):
                        continue
                    seen.add(keys)
                    self.cells.append((Cell(i, slot.name, slot.label, bench), keys))
        return f"answers ({len(self.cells)} Ray cells)", sum(len(k) for _, k in self.cells)

    def answer(self, grid: Grid, existing: dict[str, Record], sink: Sink) -> None:
        ray, task, pending = self.ray, self.ray.remote(cell_task), {}
        for cell, keys in self.cells:
            run = self.runs[cell.run]
            opts, threads = _resources(run, self.pack, self.node_cpus)
            mine = {k: existing[k] for k in keys if k in existing}
            # one .options() call: Ray's options wrapper has no .options of its own
            ref = task.options(max_retries=TASK_RETRIES, retry_exceptions=False, **opts).remote(
                run, grid.questions[cell.benchmark], self.ref, cell, mine, threads, os.environ.get(FAIL_ONCE_ENV))
            pending[ref] = (cell, keys)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            cell, keys = pending.pop(done[0])
            sink.add(ray.get(done[0]), len(keys))   # the driver is the one writer: each key once
            sink.show(f"T={self.runs[cell.run].temperature:g} {cell.benchmark} {cell.label or cell.method}")
        sink.summarize()
