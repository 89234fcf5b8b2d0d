"""Sweeps on Ray (`compare` / `ablate --ray [ADDRESS]`): a grid's cells as Ray tasks, written into
the same resumable run folder as a single-process run. Ray is optional (`pip install ray`).

A cell is one slot (AR, a method or one of its variants, at one temperature and rule) on one
benchmark: its questions and turns in order, since a second turn continues the slot's own first
answer. Each task loads the target and builds its one drafter in the worker, warms it up,
answers the cell's missing records and returns them. The driver never loads a model and is the
one writer: it appends what comes back, skipping keys already in the file, so a worker killed
mid-cell (Ray retries its task) loses only that cell's unfinished work and duplicates nothing.

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
from rich.progress import Progress

from harness.core.errors import SpecbenchError
from harness.runs.benchmarks import verify_data_dir
from harness.runs.runner import PROGRESS_COLUMNS, RunConfig, Runner
from harness.runs.slots import MethodSlot, build_slots, load_target, resolved_methods

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
    """One task: slot `label` (AR, a method, or a variant) of runner `runner` on `benchmark`."""

    runner: int
    method: str          # "ar" or a method name
    label: str           # the variant label ("" for a plain method)
    benchmark: str


@dataclass(frozen=True)
class GridRef:
    """What every task needs to rebuild its runner: the run folder and data folder (absolute), the
    ablation variants, and the driver's working directory (relative prompt-file paths resolve there)."""

    out: str
    data_dir: str | None
    variants: dict | None
    cwd: str


def _worker_runner(cfg: RunConfig, grid: GridRef, threads: int | None):
    """A Runner in a worker with its own target (the worker's copy of the grid's runner), in the
    driver's working directory (relative prompt-file paths in the config resolve as there)."""
    import torch

    from harness.core.allocator import keep_freed_memory

    keep_freed_memory()  # the CLI's heap settings, so a worker's timings compare with a local run's
    if os.path.isdir(grid.cwd):  # a node of a cluster may not have the driver's folder
        os.chdir(grid.cwd)
    if threads:
        torch.set_num_threads(threads)
    console = Console(stderr=True, quiet=True)
    runner = Runner(cfg, Path(grid.out), grid.data_dir, console, variants=grid.variants)
    runner.target = load_target(cfg, console)
    return runner


def resolve_task(cfg: RunConfig, grid: GridRef) -> dict[str, Any]:
    """In a worker: build every slot once, for meta.json's `methods_resolved` and the slots' hashes."""
    runner = _worker_runner(cfg, grid, None)
    slots = build_slots(runner.target, runner.classes, cfg, grid.variants)
    return {"methods_resolved": resolved_methods(slots),
            "slots": [(s.name, s.label, s.config_hash, s.drafter is None) for s in slots]}


def cell_task(cfg: RunConfig, grid: GridRef, cell: Cell, existing: dict[str, dict], threads: int | None,
              fail_marker: str | None = None) -> list[dict]:
    """In a worker: answer one cell's missing records (after a warm-up) and return them."""
    import torch

    runner = _worker_runner(cfg, grid, threads)
    classes = {} if cell.method == "ar" else {cell.method: runner.classes[cell.method]}
    mine = {cell.label: grid.variants[cell.label]} if (grid.variants and cell.method != "ar") else None
    slots = build_slots(runner.target, classes, cfg, mine)
    slot = slots[0] if cell.method == "ar" else slots[1]
    runner.slots = [slot]
    runner.warm_up()
    if fail_marker and not Path(fail_marker).exists():
        runner._answer = _dying(runner._answer, Path(fail_marker))
    node = {"node": socket.gethostname(), "pid": os.getpid(), "threads": torch.get_num_threads()}
    records = runner.cell_records(slot, cell.benchmark, existing)
    for rec in records:
        rec.extra["worker"] = node  # written after the record's own fields
    return records


def _dying(answer, marker: Path):
    def wrapped(*args, **kwargs):
        out = answer(*args, **kwargs)
        marker.write_text("killed once\n")
        os._exit(1)
        return out
    return wrapped


def _resources(cfg: RunConfig, pack: bool, node_cpus: int) -> tuple[dict[str, Any], int | None]:
    """(Ray resource options, torch threads) of one cell."""
    if cfg.device.startswith("cuda"):
        return {"num_gpus": 1, "num_cpus": 1}, None
    if pack:
        return {"num_cpus": 1}, 1
    return {"num_cpus": node_cpus}, node_cpus


def execute_grid_on_ray(runners: list[Runner], config: dict[str, Any], address: str | None, pack: bool,
                        console: Console) -> Path:
    """`execute_grid` with the cells as Ray tasks (see the module docstring). Returns the run folder."""
    ray = ray_module()
    first = runners[0]
    if not ray.is_initialized():
        # Workers import this project as the driver does (installed with `pip install -e .` on
        # every node of a cluster); without an address Ray starts a local one on this machine.
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    node_cpus = max(1, int(min(n["Resources"].get("CPU", 1) for n in ray.nodes() if n["Alive"])))
    grid = GridRef(str(first.run_dir.path.resolve()),
                   str(Path(first.data_dir).resolve()) if first.data_dir is not None else None,
                   first.variants, os.getcwd())
    with console.status("building the drafters once, in a worker"):
        resolved = ray.get(ray.remote(resolve_task).options(num_cpus=1).remote(first.cfg, grid))
    run_dir = first.run_dir
    run_dir.open({**config, "methods_resolved": resolved["methods_resolved"]})
    if first.data_dir is not None:
        run_dir.write_extra({"data_dir": str(first.data_dir), "official_prompts": verify_data_dir(first.data_dir)})
    existing = {r.key: r for r in run_dir.read_records()}

    # The cells, each once: AR's answers are keyed without the rule, so the runners of one
    # temperature (lossless and typical) share AR's cells. The drafters live in the workers: the
    # driver's slots stand in for them (only `drafter is None`, AR, matters to the keys).
    slot_of = {(n, lab): MethodSlot(n, None if is_ar else "in a worker", {}, h, None, lab)
               for n, lab, h, is_ar in resolved["slots"]}
    cells, seen = [], set()
    for i, r in enumerate(runners):
        for (name, label), slot in slot_of.items():
            if slot.drafter is not None and name not in r.cfg.methods:
                continue
            for bench in r.cfg.benchmarks:
                keys = tuple(r.cell_keys(slot, bench))
                if keys in seen or all(k in existing for k in keys):
                    continue
                seen.add(keys)
                cells.append((Cell(i, name, label, bench), keys))
    task = ray.remote(cell_task)
    pending = {}
    for cell, keys in cells:
        r = runners[cell.runner]
        opts, threads = _resources(r.cfg, pack, node_cpus)
        mine = {k: existing[k] for k in keys if k in existing}
        # one .options() call: Ray's options wrapper has no .options of its own
        ref = task.options(max_retries=TASK_RETRIES, retry_exceptions=False, **opts).remote(
            r.cfg, grid, cell, mine, threads, os.environ.get(FAIL_ONCE_ENV))
        pending[ref] = (cell, keys)
    total = sum(len(k) for _, k in cells)
    with Progress(*PROGRESS_COLUMNS, console=console, transient=False) as progress:
        bar = progress.add_task(f"answers ({len(cells)} Ray cells)", total=total)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            cell, keys = pending.pop(done[0])
            for rec in ray.get(done[0]):
                if rec.key not in existing:  # one writer, each key once
                    run_dir.append(rec)
                    existing[rec.key] = rec
            progress.update(bar, advance=len(keys), description=f"T={runners[cell.runner].cfg.temperature:g} "
                                                                 f"{cell.benchmark} {cell.label or cell.method}")
    first.write_summary()
    return run_dir.path
