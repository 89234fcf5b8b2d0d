"""The executor: one grid's answers into one run folder, by one of two backends.

`run_grid` is the one path of `cli.py run`, `compare` and `ablate`: it checks the config against
the machine once (data, questions, methods, settings, checkpoint), holds the run folder as its
one writer (harness/runs/folder_lock.py), refuses to resume answers made from other question
lines, builds the `Grid`, picks the backend, opens the run folder for the grid's config (a new
folder, or the same config resumed; another config is refused), writes the provenance into
meta.json (slots resolved, target runtime, data folder, and from the records whether the prompts
were the official ones), reads the answers already recorded (resume), shows one progress view and
is the folder's one writer (`Sink`: each key once). Which methods a grid compares when none are given,
and an ablation's variants, come from harness/runs/compare.py.

A backend builds the slots and answers what is missing: `LocalBackend` here, in this process on
one target, by one `Runner` per temperature and rule; `harness.runs.distributed.RayBackend` as
Ray tasks, through the same public `Runner` calls. The caller builds it
(harness/runs/backends.py:make_backend): the Ray backend builds on this module, never the reverse.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
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

from harness.core.decode import Generation, GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.machine_meta import OtherCpuUse
from harness.core.paths import beside_repo
from harness.core.rules import LOSSY_RULES
from harness.core.target import Target, check_target_spec
from harness.runs.benchmarks import Question, load_questions, official_prompts, question_file, resolve_data_dir
from harness.runs.compare import check_arch_variants, discover_methods
from harness.runs.config import RunConfig
from harness.runs.folder_lock import hold
from harness.runs.metrics import attach_divergences, write_summary
from harness.runs.record import Record, Steps, record_key
from harness.runs.results import RunDir, default_run_dir
from harness.runs.settings import check_settings
from harness.runs.slots import MethodSlot, build_slots, load_target, method_classes, resolved_methods

if TYPE_CHECKING:
    import pandas as pd

PROGRESS_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
WARMUP_TOKENS = 16
Answer = tuple[MethodSlot, Question, int]   # a slot's answer to one turn of one question


@dataclass
class Grid:
    """A grid checked and ready to answer (`run_grid` builds it)."""

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
        records = write_run_summary(self.run_dir)
        # Whether the answers are to the official prompts, from the question lines they carry.
        self.run_dir.write_extra({"official_prompts": official_prompts(
            (r.benchmark, r.question_id, r.question_sha256) for r in records)})


class Backend(Protocol):
    # Whether this process answers on a target (the driver then loads one); Ray's workers load their own.
    answers_here: bool

    def start(self, grid: Grid) -> tuple[dict[str, Any], str]:
        """Build the slots: (meta.json's `methods_resolved`, the target's runtime name)."""

    def warm_up(self, grid: Grid) -> None:
        """Untimed first calls, before the progress view starts."""

    def plan(self, grid: Grid, existing: dict[str, Record]) -> tuple[str, int]:
        """(progress label, answers the progress counts)."""

    def answer(self, grid: Grid, existing: dict[str, Record], sink: Sink) -> None:
        """Answer what `existing` lacks, handing every answer to `sink`."""


# ----------------------------------------------------------------------------- the grid

def run_grid(cfg: RunConfig, out: Path | None = None, data_dir: str | Path | None = None,
             console: Console | None = None, target: Target | None = None, *, command: str = "run",
             variants: dict[str, dict[str, Any]] | None = None, ablation: dict[str, Any] | None = None,
             train_steps: int = 0, backend: Backend | None = None) -> Path:
    """The one path of `cli.py run`, `compare` and `ablate` (`command`, which meta.json stores):
    check `cfg` against this machine once (data, questions, methods, settings, checkpoint), load
    the target where the driver needs it (to find the methods, check variants, or answer), build
    the `Grid` and run it by a backend into one run folder (see the module docstring); returns the
    folder (resumes finished answers). User errors are raised before the target loads.

    `target`: an already loaded one (tests); `variants`/`ablation`: `ablation_grid`'s; `backend`:
    who answers (harness/runs/backends.py:make_backend; default: this process).
    """
    console = console or Console(stderr=True)
    backend = backend or LocalBackend()
    request = run_request(cfg, command, ablation)
    out = run_folder(cfg, out, command, ablation)
    # Built-in benchmarks are read from the data folder; a run of prompt files alone needs none.
    data_dir = resolve_data_dir(data_dir) if any(b not in cfg.prompt_files for b in cfg.benchmarks) else None
    questions = {b: load_questions(b, data_dir, cfg.limit, cfg.ids, cfg.files()) for b in cfg.benchmarks}
    if target is None:
        check_target_spec(cfg.target)
    # Every method's settings are checked before a model loads; compare without --methods checks
    # them against every method it may find.
    classes = checked_classes(cfg) if cfg.methods is not None else {}
    if cfg.methods is None:
        check_settings(cfg.settings, importable_classes())
    with hold(out):   # the folder's one writer from here (harness/runs/folder_lock.py)
        files = {b: question_file(b, data_dir, cfg.files()) for b in questions}
        check_same_questions(RunDir(out), questions, files)   # before the target loads
        # On Ray the workers load the target; the driver needs one only to find methods or check variants.
        if target is None and (backend.answers_here or cfg.methods is None or variants):
            target = load_target(cfg, console)
        if cfg.methods is None:
            found = discover_methods(target, cfg.settings, console)
            for name, problem in lossless_refusals(replace(cfg, methods=found), method_classes(found)).items():
                console.print(f"[dim]not compared: {problem}[/]")
                found.remove(name)
            console.print(f"methods: {', '.join(found)}")
            cfg = replace(cfg, methods=found, typical=[m for m in cfg.typical if m in found])
            classes = checked_classes(cfg)
        if variants:
            check_arch_variants(classes[cfg.methods[0]], variants, target, train_steps, console)
        stored = {**request, "methods": cfg.methods}
        if ablation:
            stored["ablation"] = ablation
        grid = Grid(cfg, questions, classes, variants, RunDir(out), data_dir, stored, console, target)
        # The run, whichever backend answers: the slots, the folder and its provenance, resume, progress.
        resolved, runtime = backend.start(grid)
        run_dir = grid.run_dir
        run_dir.open({**grid.stored, "methods_resolved": resolved})
        # What the timings ran on (harness/core/runtime.py): the same config may run on either.
        run_dir.write_extra({"target_runtime": runtime})
        if data_dir is not None:
            run_dir.write_extra({"data_dir": beside_repo(data_dir)})
        backend.warm_up(grid)
        existing = {r.key: r for r in run_dir.read_records()}
        label, total = backend.plan(grid, existing)
        with Progress(*PROGRESS_COLUMNS, console=console, transient=False) as progress:
            sink = Sink(run_dir, existing, progress, progress.add_task(label, total=total))
            backend.answer(grid, existing, sink)
        return run_dir.path


def run_request(cfg: RunConfig, command: str = "run", ablation: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config a run folder is asked for (meta.json's, before the methods are resolved)."""
    request = cfg.to_dict(command)
    if ablation:
        request["ablation"] = {k: ablation[k] for k in ("method", "sweep", "fixed", "grid")}
    return request


def run_folder(cfg: RunConfig, out: Path | str | None, command: str = "run",
               ablation: dict[str, Any] | None = None) -> Path:
    """The folder `run_grid` writes: `out`, else results/runs/<hash of the request>."""
    return Path(out) if out else default_run_dir(run_request(cfg, command, ablation))


def importable_classes() -> dict[str, type]:
    """Every method that imports (a broken one is reported where methods are found)."""
    from methods.registry import get_method, method_names

    out = {}
    for name in method_names():
        try:
            out[name] = get_method(name)
        except Exception:  # noqa: BLE001 - discover_methods names the method that cannot import
            continue
    return out


def check_same_questions(run_dir: RunDir, questions: dict[str, list[Question]], files: dict[str, Path]) -> None:
    """Refuse to resume a folder whose answers were made from other question lines than the
    ones read now (an edited copy of a benchmark, another --data-dir): its tables would mix them."""
    now = {(q.benchmark, q.question_id): q.sha256 for qs in questions.values() for q in qs}
    for rec in run_dir.read_records():
        line = now.get((rec.benchmark, rec.question_id))
        if rec.question_sha256 and line and line != rec.question_sha256:
            raise SpecbenchError(
                f"{files[rec.benchmark]}: question {rec.question_id} is not the line the answers in {run_dir.path} were "
                f"made from (sha256 {line[:12]}... now, {rec.question_sha256[:12]}... recorded); point --data-dir at "
                "the files the run began with, or use another --out")


def checked_classes(cfg: RunConfig) -> dict[str, type]:
    """The Drafter classes of `cfg`'s methods, with its --set keys, --checkpoint and temperatures
    checked against them."""
    classes = method_classes(cfg.methods)
    check_settings(cfg.settings, classes)
    if cfg.checkpoint and not any(c.trainable for c in classes.values()):
        raise SpecbenchError("--checkpoint given, but no method of this run loads weights")
    for problem in lossless_refusals(cfg, classes).values():
        raise SpecbenchError(problem)
    return classes


def lossless_refusals(cfg: RunConfig, classes: dict[str, type]) -> dict[str, str]:
    """Methods that cannot sample losslessly at a temperature of `cfg` (they declare no lossless
    rule: their trees carry no draft law q), each with the one line that says so."""
    hot = [t for t in cfg.temperatures if t > 0 and cfg.rule(t) == "lossless"]
    return {name: f"method '{name}' declares acceptance rules {', '.join(cls.acceptance_rules)} only: its drafts "
                  f"carry no draft law q, so it cannot sample losslessly at --temperature {hot[0]:g}; run it at -t 0"
            for name, cls in classes.items() if hot and "lossless" not in cls.acceptance_rules}


class LocalBackend:
    """Every answer in this process, on one target with one set of drafters shared by every
    temperature; a runner's methods take turns per prompt; summary.csv after each benchmark."""

    answers_here = True

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


# ----------------------------------------------------------------------------- one temperature's answers
# The unit of work is one keyed answer (method config hash, benchmark, question, turn, temperature,
# acceptance, seed): `Runner.answer` gives it, or None when the run folder holds it already, so a
# killed run resumes where it stopped. The backends walk a schedule of answers through it: the
# local one `rotation` (methods take turns per prompt), the Ray one a `cell` (one slot on one
# benchmark). The Runner never writes: its caller is the run folder's one writer.

def answer_seed(seed: int, benchmark: str, question_id: int, turn: int) -> int:
    """Per-answer seed: sampling results never depend on the order questions run in."""
    h = hashlib.sha256(f"{seed}:{benchmark}:{question_id}:{turn}".encode()).digest()
    return int.from_bytes(h[:4], "little")


class Runner:
    """The answers of one RunConfig of one temperature and rule (`RunConfig.runs`): its questions
    x `slots` (AR and the methods, or an ablation's variants). `target` is None where only keys
    are asked (the Ray driver)."""

    def __init__(self, cfg: RunConfig, questions: dict[str, list[Question]], target: Target | None,
                 slots: list[MethodSlot]) -> None:
        self.cfg = cfg
        self.questions = questions
        self.target = target
        self.slots = slots
        self._rotation = 0                             # prompts scheduled so far (`rotation`)
        self._histories: dict[str, list[dict]] = {}    # each slot's conversation so far, by config hash

    def total_answers(self) -> int:
        return sum(len(q.turns) for qs in self.questions.values() for q in qs) * len(self.slots)

    # ------------------------------------------------------------------ the schedules
    def rotation(self, bench: str) -> Iterator[Answer]:
        """Every answer on `bench`, question by question and turn by turn, the slots in an order
        rotated per prompt so that machine drift favours no method."""
        for q in self.questions[bench]:
            for turn in range(len(q.turns)):
                k = self._rotation % len(self.slots)
                self._rotation += 1
                for slot in self.slots[k:] + self.slots[:k]:
                    yield slot, q, turn

    def cell(self, slot: MethodSlot, bench: str) -> Iterator[Answer]:
        """One cell: `slot`'s answers on `bench`, in question and turn order."""
        for q in self.questions[bench]:
            for turn in range(len(q.turns)):
                yield slot, q, turn

    def cell_keys(self, slot: MethodSlot, bench: str) -> list[str]:
        """Record keys of one cell (a slot on one benchmark: every question and turn)."""
        return [record_key(self._probe(slot, bench, q.question_id, turn)) for _, q, turn in self.cell(slot, bench)]

    # ------------------------------------------------------------------ one answer
    def answer(self, slot: MethodSlot, q: Question, turn: int, existing: dict[str, Record]) -> Record | None:
        """`slot`'s answer to turn `turn` of `q`, after its own earlier turns of `q` (so a schedule
        gives a slot's turns of one question in order, with no other question of it between);
        None when `existing` (the run folder's records by key) holds it already."""
        history = [] if turn == 0 else self._histories[slot.config_hash]
        messages = history + [{"role": "user", "content": q.turns[turn]}]
        probe = self._probe(slot, q.benchmark, q.question_id, turn)
        key = record_key(probe)
        rec = None
        if key in existing:
            out_ids = existing[key].output_ids
        else:
            prompt_ids = self.target.encode_chat(messages)
            gen_cfg = GenerationConfig(self.cfg.max_new_tokens, self.cfg.sampling(), seed=probe["seed"],
                                       record_logit_gaps=(slot.drafter is None and self.cfg.temperature == 0))
            with OtherCpuUse() as others:
                g = generate(self.target, prompt_ids, gen_cfg, slot.drafter)
            rec = self._record(slot, q, turn, probe["seed"], prompt_ids, g)
            if others.cores is not None:  # what other processes ran meanwhile: a contended answer's seconds are noisy
                rec.other_cpu_cores = round(others.cores, 3)
            out_ids = g.output_ids
        # Each method continues MT-Bench turn 2 from its own turn-1 answer (variants of one
        # method from their own: histories are keyed by config hash).
        self._histories[slot.config_hash] = messages + [
            {"role": "assistant", "content": self.target.decode(out_ids).strip()}]
        return rec

    def _record(self, slot: MethodSlot, q: Question, turn: int, seed: int, prompt_ids: list[int],
                g: Generation) -> Record:
        """The typed record of `g` (a constructor: no I/O, nothing else)."""
        return Record(
            method=slot.name, method_config=slot.config, config_hash=slot.config_hash,
            checkpoint_hash=slot.checkpoint_hash, target=self.cfg.target,
            dtype=str(self.target.dtype).replace("torch.", ""), device=str(self.target.device),
            benchmark=q.benchmark, question_id=q.question_id, category=q.category, turn=turn,
            temperature=float(self.cfg.temperature), top_p=float(self.cfg.top_p),
            acceptance="none" if slot.drafter is None else self.cfg.acceptance, seed=seed,
            lossy=slot.drafter is not None and self.cfg.acceptance in LOSSY_RULES,
            prompt_sha256=self._prompt_file_fields(q.benchmark).get("prompt_sha256"), question_sha256=q.sha256 or None,
            prompt_tokens=len(prompt_ids), new_tokens=len(g.output_ids), output_ids=g.output_ids,
            stop_reason=g.stop_reason, wall_s=round(g.wall_s, 6), prefill_s=round(g.prefill_s, 6),
            first_token_from_prefill=True, steps=Steps.from_dict(g.steps),
            ar_top1=None if g.top1 is None else [round(x, 5) for x in g.top1],
            ar_gap=None if g.top1 is None else [round(x, 5) for x in g.gap])

    def _prompt_file_fields(self, benchmark: str) -> dict[str, str]:
        """A prompt file's SHA-256, which its records carry and their keys include."""
        f = self.cfg.prompt_files.get(benchmark)
        return {"prompt_sha256": f["sha256"]} if f else {}

    def _probe(self, slot: MethodSlot, bench: str, question_id: int, turn: int) -> dict[str, Any]:
        """The fields of an answer's record that make its key."""
        return {"method": slot.name, "config_hash": slot.config_hash, "benchmark": bench,
                "question_id": question_id, "turn": turn, "temperature": float(self.cfg.temperature),
                "acceptance": "none" if slot.drafter is None else self.cfg.acceptance,
                "seed": answer_seed(self.cfg.seed, bench, question_id, turn), **self._prompt_file_fields(bench)}

    def warm_up(self) -> None:
        """One untimed short generation per method at this temperature, so no method pays for
        first-call costs."""
        first = next((qs[0] for qs in self.questions.values() if qs), None)
        if first is None:
            return
        ids = self.target.encode_chat([{"role": "user", "content": first.turns[0]}])
        for slot in self.slots:
            cfg = GenerationConfig(min(WARMUP_TOKENS, self.cfg.max_new_tokens), self.cfg.sampling(), seed=0)
            generate(self.target, ids, cfg, slot.drafter)
        runtimes = [self.target.runtime] + [r for s in self.slots if s.drafter is not None for r in s.drafter.runtimes()]
        for runtime in runtimes:
            if runtime is not None:
                runtime.warm_up_seen()


def write_run_summary(run_dir: RunDir) -> list[Record]:
    """Rewrite summary.csv from every record of the run folder; return the records."""
    records = run_dir.read_records()
    write_summary(attach_divergences(records), run_dir.summary_path)
    return records


def summarize_dir(path: Path) -> pd.DataFrame:
    """Rebuild summary.csv of a run directory from its records alone (`cli.py summary`); return it."""
    rd = RunDir(path)
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    with hold(path, "run folder"):
        return write_summary(attach_divergences(rd.read_records()), rd.summary_path)
