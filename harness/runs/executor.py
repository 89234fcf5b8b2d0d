"""The executor: one grid's answers into one run folder, by one of two backends.

`execute` does what every run shares, whichever backend answers: it opens the run folder for the
grid's config (a new folder, or the same config resumed; another config is refused), writes the
provenance into meta.json (slots resolved, target runtime, data folder), reads the answers already
recorded (resume), shows one progress view and is the folder's one writer (`Sink`: each key once).
A backend builds the slots and answers what is missing: `LocalBackend` here, in this process on
one target; `harness.runs.distributed.RayBackend` as Ray tasks.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.runs.benchmarks import Question, verify_data_dir
from harness.runs.config import RunConfig
from harness.runs.metrics import attach_divergences, write_summary
from harness.runs.record import Record
from harness.runs.results import RunDir
from harness.runs.runner import Runner
from harness.runs.slots import build_slots, load_target, resolved_methods

if TYPE_CHECKING:
    import pandas as pd

PROGRESS_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())


@dataclass
class Grid:
    """A grid checked and ready to answer (harness.runs.compare.run_grid builds it)."""

    cfg: RunConfig                           # methods resolved; `cfg.runs()`: one Runner each
    questions: dict[str, list[Question]]     # per benchmark, loaded once
    classes: dict[str, type]                 # the methods' Drafter classes
    variants: dict[str, dict[str, Any]] | None   # ablate: {label: overrides} of its one method
    run_dir: RunDir
    data_dir: Path | None                    # None: prompt files only
    stored: dict[str, Any]                   # meta.json's config
    console: Console
    target: Target | None = None             # loaded by the local backend when None


class Sink:
    """What a backend hands its answers to: the run folder's one writer (each key once, so a
    retried Ray cell duplicates nothing) and the progress view."""

    def __init__(self, run_dir: RunDir, existing: dict[str, Record], progress: Progress, task: TaskID) -> None:
        self.run_dir, self.existing, self.progress, self.task = run_dir, existing, progress, task

    def show(self, description: str) -> None:
        self.progress.update(self.task, description=description)

    def add(self, records: Iterable[Record], answers: int) -> None:
        """Append the records not in the folder yet; advance the view by `answers`."""
        for rec in records:
            if rec.key not in self.existing:
                self.run_dir.append(rec)
                self.existing[rec.key] = rec
        self.progress.advance(self.task, answers)

    def summarize(self) -> None:
        write_run_summary(self.run_dir)


class Backend(Protocol):
    def start(self, grid: Grid) -> tuple[dict[str, Any], str]:
        """Build the slots: (meta.json's `methods_resolved`, the target's runtime name)."""

    def warm_up(self, grid: Grid) -> None:
        """Untimed first calls, before the progress view starts."""

    def plan(self, grid: Grid, existing: dict[str, Record]) -> tuple[str, int]:
        """(progress label, answers the progress counts)."""

    def answer(self, grid: Grid, existing: dict[str, Record], sink: Sink) -> None:
        """Answer what `existing` lacks, handing every answer to `sink`."""


def execute(grid: Grid, backend: Backend) -> Path:
    """Run `grid` by `backend` into its run folder (resumes; see the module docstring). Returns the folder."""
    resolved, runtime = backend.start(grid)
    run_dir = grid.run_dir
    run_dir.open({**grid.stored, "methods_resolved": resolved})
    # What the timings ran on (harness/core/runtime.py): the same config may run on either.
    run_dir.write_extra({"target_runtime": runtime})
    if grid.data_dir is not None:
        run_dir.write_extra({"data_dir": str(grid.data_dir), "official_prompts": verify_data_dir(grid.data_dir)})
    backend.warm_up(grid)
    existing = {r.key: r for r in run_dir.read_records()}
    label, total = backend.plan(grid, existing)
    with Progress(*PROGRESS_COLUMNS, console=grid.console, transient=False) as progress:
        backend.answer(grid, existing, Sink(run_dir, existing, progress, progress.add_task(label, total=total)))
    return run_dir.path


class LocalBackend:
    """Every answer in this process, on one target with one set of drafters shared by every
    temperature; a runner's methods take turns per prompt; summary.csv after each benchmark."""

    def __init__(self) -> None:
        self.runners: list[Runner] = []

    def start(self, grid: Grid) -> tuple[dict[str, Any], str]:
        target = grid.target if grid.target is not None else load_target(grid.cfg, grid.console)
        slots = build_slots(target, grid.classes, grid.cfg, grid.variants)
        # AR runs in every runner; its answers are keyed without the rule, so a second rule at
        # one temperature (Medusa's typical beside lossless) reuses them instead of rerunning AR.
        self.runners = [Runner(run, grid.questions, target,
                               [s for s in slots if s.drafter is None or s.name in run.methods])
                        for run in grid.cfg.runs()]
        return resolved_methods(slots), target.runtime_name

    def warm_up(self, grid: Grid) -> None:
        compiled = self.runners[0].target.runtime_name.startswith("compiled")
        with grid.console.status("warming up" + (" and compiling (minutes the first time on a machine)" if compiled else "")):
            for r in self.runners:
                r.warm_up()

    def plan(self, grid: Grid, existing: dict[str, Record]) -> tuple[str, int]:
        return "answers", sum(r.total_answers() for r in self.runners)

    def answer(self, grid: Grid, existing: dict[str, Record], sink: Sink) -> None:
        for r in self.runners:
            prefix = f"T={r.cfg.temperature:g} " if len(self.runners) > 1 else ""
            for bench in r.questions:
                for slot, q, turn in r.rotation(bench):
                    sink.show(f"{prefix}{bench} q{q.question_id} t{turn} {slot.label or slot.name}")
                    rec = r.answer(slot, q, turn, existing)
                    sink.add([rec] if rec is not None else [], 1)
                sink.summarize()


def write_run_summary(run_dir: RunDir) -> pd.DataFrame:
    """Rewrite summary.csv from every record of the run folder; return it."""
    return write_summary(attach_divergences(run_dir.read_records()), run_dir.summary_path)


def summarize_dir(path: Path) -> pd.DataFrame:
    """Rebuild summary.csv of a run directory from its records alone (`cli.py summary`)."""
    rd = RunDir(path)
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    return write_run_summary(rd)
