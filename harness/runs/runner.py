"""Runs AR and methods over benchmark prompts, appends one record per answer, resumes, shows progress.

The unit of work is one keyed cell (method config hash, benchmark, question, turn, temperature,
acceptance, seed): finished cells are skipped on a rerun, so a killed run resumes where it
stopped and a later distributed backend can hand cells out without changing the loop.

Every run is a grid of temperatures: `cli.py run` is a grid of one, `compare` and `ablate`
(harness.runs.compare) grids of several. `execute_grid` is the one path they all take (target,
drafters, run folder, warm-up, progress); a `Runner` holds the cells of one temperature.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from harness.core.target import Target, check_target_spec
from harness.core.verify import LOSSY_RULES, Sampling, default_rule
from harness.runs.benchmarks import PromptFile, Question, load_questions, resolve_data_dir, verify_data_dir
from harness.runs.metrics import AR_METHOD, attach_divergences, write_summary
from harness.runs.record import Record, Steps
from harness.runs.results import RunDir, default_run_dir, record_key
from harness.runs.settings import check_settings
from harness.runs.slots import MethodSlot, build_slots, load_target, resolved_methods

if TYPE_CHECKING:
    import pandas as pd

WARMUP_TOKENS = 16


@dataclass
class RunConfig:
    """Everything that determines a run's numbers (its hash names the default output folder)."""

    methods: list[str]
    benchmarks: list[str]
    target: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None   # an accelerate strategy sharding the target over GPUs
    compile: bool = False           # the compiled target runtime (harness/core/runtime.py)
    limit: int | None = None
    ids: list[int] | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    acceptance: str | None = None
    seed: int = 0
    checkpoint: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)   # --set: {key: v} or {"method.key": v}
    chat_template: str | None = None
    system_prompt: str | None = None
    # A user's prompt files among `benchmarks`: {name: {"path", "sha256"}} (harness.runs.benchmarks).
    prompt_files: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = default_rule(self.temperature)
        if self.max_new_tokens < 1:
            raise SpecbenchError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise SpecbenchError(f"--limit must be >= 1, got {self.limit}")
        self.sampling()  # validates temperature / top-p / acceptance together

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.acceptance)

    def to_dict(self) -> dict[str, Any]:
        """The config as meta.json stores it; `prompt_files`, `device_map` and `compile` only when
        set, so run folders made before they existed keep their config hash and resume."""
        out = asdict(self)
        for key in ("prompt_files", "device_map", "compile"):
            if not out[key]:
                del out[key]
        return out

    def files(self) -> dict[str, PromptFile]:
        return {name: PromptFile(name, f["path"], f["sha256"]) for name, f in self.prompt_files.items()}


def answer_seed(seed: int, benchmark: str, question_id: int, turn: int) -> int:
    """Per-answer seed: sampling results never depend on the order questions run in."""
    h = hashlib.sha256(f"{seed}:{benchmark}:{question_id}:{turn}".encode()).digest()
    return int.from_bytes(h[:4], "little")


PROGRESS_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())


# ----------------------------------------------------------------------------- the grid's shared parts

def _shared_part(cfg: RunConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.to_dict().items() if k not in ("temperature", "acceptance", "methods")}


def execute_grid(runners: list[Runner], config: dict[str, Any]) -> Path:
    """The one path of `run`, `compare` and `ablate`: the cells of every runner (one per
    temperature, otherwise the same RunConfig, data and run folder) on one target with one set
    of drafters. Loads the target unless the runners hold one, builds the drafters, opens the
    run folder for `config` (+ `methods_resolved`; another config there is refused), warms every
    method up at every temperature, then answers the cells not recorded yet under one progress
    view. Returns the run folder."""
    first = runners[0]
    for r in runners[1:]:
        if _shared_part(r.cfg) != _shared_part(first.cfg) or r.run_dir.path != first.run_dir.path \
                or r.variants != first.variants or r.data_dir != first.data_dir \
                or not set(r.cfg.methods) <= set(first.cfg.methods):
            raise ValueError("execute_grid: the runners of one grid differ in more than the temperature, "
                             "the rule and a subset of the methods")
    target = first.target if first.target is not None else load_target(first.cfg, first.console)
    slots = build_slots(target, first.classes, first.cfg, first.variants)
    for r in runners:
        # AR runs in every runner; its answers are keyed without the rule, so a second rule at
        # one temperature (Medusa's typical beside lossless) reuses them instead of rerunning AR.
        r.target, r.run_dir = target, first.run_dir
        r.slots = [s for s in slots if s.drafter is None or s.name in r.cfg.methods]
    run_dir = first.run_dir
    run_dir.open({**config, "methods_resolved": resolved_methods(slots)})
    # What the timings ran on (harness/core/runtime.py): the same config may run on either.
    run_dir.write_extra({"target_runtime": target.runtime_name})
    if first.data_dir is not None:
        run_dir.write_extra({"data_dir": str(first.data_dir), "official_prompts": verify_data_dir(first.data_dir)})
    with first.console.status("warming up" + (" and compiling (minutes the first time on a machine)"
                                              if target.runtime_name.startswith("compiled") else "")):
        for r in runners:
            r.warm_up()
    with Progress(*PROGRESS_COLUMNS, console=first.console, transient=False) as progress:
        task = progress.add_task("answers", total=sum(r.total_answers() for r in runners))
        for r in runners:
            r.run_cells(progress, task, prefix=f"T={r.cfg.temperature:g} " if len(runners) > 1 else "")
    return run_dir.path


# ----------------------------------------------------------------------------- one temperature's cells

class Runner:
    """The cells of one RunConfig (one temperature): its questions x AR and its methods, in a
    per-prompt rotation. `run()` runs it alone, as a one-temperature grid (`execute_grid`);
    `harness.runs.compare` puts one Runner per temperature into one grid. User errors (methods,
    settings, benchmarks, limits) are raised here, before any model loads. `variants` (used by
    `cli.py ablate`): several override sets of the run's method, each its own slot beside AR
    (labels are the dict keys)."""

    def __init__(self, cfg: RunConfig, out: Path | None = None, data_dir: str | Path | None = None,
                 console: Console | None = None, target: Target | None = None,
                 variants: dict[str, dict[str, Any]] | None = None) -> None:
        from methods.registry import get_method

        self.variants = variants
        self.cfg = cfg
        self.console = console or Console(stderr=True)
        # Built-in benchmarks are read from the data folder; a run of prompt files alone needs none.
        builtin = [b for b in cfg.benchmarks if b not in cfg.prompt_files]
        self.data_dir = resolve_data_dir(data_dir) if builtin else None
        names = [m for m in cfg.methods if m != AR_METHOD]
        if len(set(names)) != len(names):
            raise SpecbenchError(f"--method lists a method twice: {','.join(cfg.methods)}")
        if target is None:
            check_target_spec(cfg.target)
        self.classes = {m: get_method(m) for m in names}   # unknown names fail here, before loading
        check_settings(cfg.settings, self.classes)
        if cfg.checkpoint and not any(c.trainable for c in self.classes.values()):
            raise SpecbenchError("--checkpoint given, but no method of this run loads weights")
        self.questions = {b: load_questions(b, self.data_dir, cfg.limit, cfg.ids, cfg.files()) for b in cfg.benchmarks}
        self.run_dir = RunDir(out or default_run_dir(cfg.to_dict()))
        self.target = target
        self.slots: list[MethodSlot] = []   # filled by execute_grid

    def run(self) -> Path:
        """Run this config alone into its run folder (meta.json stores the RunConfig); resumes."""
        return execute_grid([self], self.cfg.to_dict())

    def total_answers(self) -> int:
        return sum(len(q.turns) for qs in self.questions.values() for q in qs) * len(self.slots)

    # ------------------------------------------------------------------ one answer
    def _answer(self, slot: MethodSlot, prompt_ids: list[int], seed: int) -> Generation:
        cfg = GenerationConfig(self.cfg.max_new_tokens, self.cfg.sampling(), seed=seed,
                               record_logit_gaps=(slot.drafter is None and self.cfg.temperature == 0))
        return generate(self.target, prompt_ids, cfg, slot.drafter)

    def _record(self, slot: MethodSlot, q: Question, turn: int, seed: int, prompt_ids: list[int],
                g: Generation) -> Record:
        return Record(
            method=slot.name, method_config=slot.config, config_hash=slot.config_hash,
            checkpoint_hash=slot.checkpoint_hash, target=self.cfg.target,
            dtype=str(self.target.dtype).replace("torch.", ""), device=str(self.target.device),
            benchmark=q.benchmark, question_id=q.question_id, category=q.category, turn=turn,
            temperature=float(self.cfg.temperature), top_p=float(self.cfg.top_p),
            acceptance="none" if slot.drafter is None else self.cfg.acceptance, seed=seed,
            lossy=slot.drafter is not None and self.cfg.acceptance in LOSSY_RULES,
            prompt_sha256=self._prompt_file_fields(q.benchmark).get("prompt_sha256"),
            prompt_tokens=len(prompt_ids), new_tokens=len(g.output_ids), output_ids=g.output_ids,
            stop_reason=g.stop_reason, wall_s=round(g.wall_s, 6), prefill_s=round(g.prefill_s, 6),
            first_token_from_prefill=True, steps=Steps.from_dict(g.steps),
            ar_top1=None if g.top1 is None else [round(x, 5) for x in g.top1],
            ar_gap=None if g.top1 is None else [round(x, 5) for x in g.gap])

    def _prompt_file_fields(self, benchmark: str) -> dict[str, str]:
        """A prompt file's SHA-256, which its records carry and their keys include."""
        f = self.cfg.prompt_files.get(benchmark)
        return {"prompt_sha256": f["sha256"]} if f else {}

    # ------------------------------------------------------------------ the cells
    def run_cells(self, progress: Progress, task: TaskID, prefix: str = "") -> None:
        """Answer every cell not recorded yet, advancing `task` of `progress` once per answer;
        summary.csv is rewritten after each benchmark. Methods take turns per prompt."""
        existing = {r.key: r for r in self.run_dir.read_records()}
        rotation = 0
        for bench, questions in self.questions.items():
            for q in questions:
                # Keyed by config hash: variants of one method keep their own conversations.
                histories: dict[str, list[dict]] = {s.config_hash: [] for s in self.slots}
                for turn in range(len(q.turns)):
                    # Rotate the order per prompt so that machine drift favours no method.
                    order = self.slots[rotation % len(self.slots):] + self.slots[:rotation % len(self.slots)]
                    rotation += 1
                    for slot in order:
                        progress.update(task, description=f"{prefix}{bench} q{q.question_id} t{turn} "
                                                          f"{slot.label or slot.name}")
                        rec, histories[slot.config_hash] = self._turn(slot, q, turn, histories[slot.config_hash],
                                                                      existing)
                        if rec is not None:
                            self.run_dir.append(rec)
                        progress.advance(task)
            self.write_summary()

    def cell_keys(self, slot: MethodSlot, bench: str) -> list[str]:
        """Record keys of one cell (a slot on one benchmark: every question and turn)."""
        return [record_key(self._probe(slot, bench, q.question_id, turn))
                for q in self.questions[bench] for turn in range(len(q.turns))]

    def cell_records(self, slot: MethodSlot, bench: str, existing: dict[str, Record]) -> list[Record]:
        """Answer one cell's missing records in question and turn order and return them (the
        caller appends: on Ray the driver is the one writer). `existing`: its finished records."""
        out = []
        for q in self.questions[bench]:
            history: list[dict] = []
            for turn in range(len(q.turns)):
                rec, history = self._turn(slot, q, turn, history, existing)
                if rec is not None:
                    out.append(rec)
        return out

    def _probe(self, slot: MethodSlot, bench: str, question_id: int, turn: int) -> dict[str, Any]:
        """The fields of an answer's record that make its key."""
        return {"method": slot.name, "config_hash": slot.config_hash, "benchmark": bench,
                "question_id": question_id, "turn": turn, "temperature": float(self.cfg.temperature),
                "acceptance": "none" if slot.drafter is None else self.cfg.acceptance,
                "seed": answer_seed(self.cfg.seed, bench, question_id, turn), **self._prompt_file_fields(bench)}

    def _turn(self, slot: MethodSlot, q: Question, turn: int, history: list[dict],
              existing: dict[str, Record]) -> tuple[Record | None, list[dict]]:
        """One answer of `slot` to turn `turn` of `q` after its own `history`: (the new record, or
        None when it was recorded already, and the history extended by this turn)."""
        messages = history + [{"role": "user", "content": q.turns[turn]}]
        probe = self._probe(slot, q.benchmark, q.question_id, turn)
        key = record_key(probe)
        rec = None
        if key in existing:
            out_ids = existing[key].output_ids
        else:
            prompt_ids = self.target.encode_chat(messages)
            with OtherCpuUse() as others:
                g = self._answer(slot, prompt_ids, probe["seed"])
            rec = self._record(slot, q, turn, probe["seed"], prompt_ids, g)
            if others.cores is not None:  # what other processes ran meanwhile: a contended answer's seconds are noisy
                rec.other_cpu_cores = round(others.cores, 3)
            out_ids = g.output_ids
        # Each method continues MT-Bench turn 2 from its own turn-1 answer.
        return rec, messages + [{"role": "assistant", "content": self.target.decode(out_ids).strip()}]

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

    def write_summary(self) -> pd.DataFrame:
        """Rewrite summary.csv from every record of the run folder; return it."""
        records = attach_divergences(self.run_dir.read_records())
        return write_summary(records, self.run_dir.summary_path)


def summarize_dir(path: Path) -> pd.DataFrame:
    """Rebuild summary.csv of a run directory from its records alone."""
    rd = RunDir(path)
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    return write_summary(attach_divergences(rd.read_records()), rd.summary_path)
